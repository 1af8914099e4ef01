"""Ray Data across raylets: a `ray.cluster_utils.Cluster` of two raylets on this machine (as Ray's own tests
simulate nodes), reading from and writing to the suite's S3 endpoint; examples/ray_cluster.py as users run it,
`convert --engine ray`, and a raylet killed in the middle of a write.

Every raylet listens on 127.0.0.1; the cluster is shut down after the module (conftest's ray_session says why).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest
import ray
from helpers import tree

import atlas_remote as ar
from atlas_remote.cli import main as cli
from atlas_remote.write.ray_data import read_atlas, write_atlas

# slow: a cluster of two raylets takes 10 to 30 s to start on 2 cores. One group: with `--dist loadgroup` every test
# of the module runs on one pytest worker, so one cluster is started (plain `--dist load` may start one per worker).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray_cluster")]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_cluster.py"
ROWS = [{"id": i, "text": f"  Row {i}  OF the  dataset "} for i in range(4000)]


def example():
    spec = importlib.util.spec_from_file_location("ray_cluster_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster():
    """A head raylet and one more, one CPU each; this process is the driver."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        assert len(nodes) == 2 and {node["NodeManagerAddress"] for node in nodes} == {"127.0.0.1"}
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def dataset(s3):
    """4,000 rows in 8 shards of 500 on S3: 8 read tasks."""
    options, bucket, _ = s3
    url = f"s3://{bucket}/src"
    with ar.AtlasDatasetWriter(url, 500, 50, storage_options=options) as w:
        w.add_examples(ROWS)
    return options, bucket, url


def test_the_example_reads_on_every_node_and_rewrites_exactly(cluster, dataset):
    options, bucket, url = dataset
    done = example().main([url, f"s3://{bucket}/clean", "--storage-options", json.dumps(options)])
    assert len(done["rows_by_node"]) == 2, f"read tasks ran on both raylets: {done['rows_by_node']}"
    assert sum(done["rows_by_node"].values()) == 4000 and done["written"] == 4000  # and main checked every row
    assert not any(name.startswith(".atlas") for name in tree(f"s3://{bucket}/clean", options)), "nothing staged left"
    tagged = read_atlas(url, storage_options=options).map_batches(example().with_node).materialize()
    assert "ReadAtlas->MapBatches(with_node)" in tagged.stats(), "rows tagged in the read tasks themselves"


def test_convert_with_the_ray_engine_from_s3_to_s3(cluster, s3):
    options, bucket, fs = s3
    for part in range(4):
        rows = ROWS[part * 100 : part * 100 + 100]
        fs.pipe(f"{bucket}/raw/part-{part}.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())
    command = [
        *("convert", f"s3://{bucket}/raw/*.jsonl", f"s3://{bucket}/converted", "--from", "jsonl"),
        *("--engine", "ray", "--shard-size", "150", "--block-size", "10", "--quiet"),
        *("--storage-options", json.dumps(options)),
    ]
    with pytest.raises(SystemExit) as done:
        cli(command)
    assert done.value.code == 0
    assert list(ar.open(f"s3://{bucket}/converted", storage_options=options)) == ROWS[:400], "in input order"


def kill_when_holding(cluster, victim, marker: Path) -> threading.Thread:
    """Kill the victim raylet (and its workers) as soon as a write task there says it is mid-part."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(victim, allow_graceful=False)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def hold(victim: str, marker: str, others_wait_for: tuple[str, dict] | None):
    """A map that Ray fuses into the write task. Mid-part (the part's first shards staged), on the victim it
    waits to be killed; elsewhere, given (dest, options), it waits until the failed write has deleted the
    staging, so that those tasks finish their parts after it (Ray does not wait for them)."""

    def map_batch(batch: dict) -> dict:
        if not any(i % 500 == 300 for i in batch["id"]):
            return batch
        if ray.get_runtime_context().get_node_id() == victim:
            Path(marker).touch()
            time.sleep(300)
        elif others_wait_for:
            import fsspec

            dest, options = others_wait_for
            fs, root = fsspec.core.url_to_fs(dest, **options)
            deadline = time.monotonic() + 60
            while not fs.glob(f"{root}/.atlas-staging/*/parts.json") and time.monotonic() < deadline:
                fs.invalidate_cache()
                time.sleep(0.1)  # until the write has started...
            while fs.glob(f"{root}/.atlas-staging/*/parts.json") and time.monotonic() < deadline:
                fs.invalidate_cache()
                time.sleep(0.1)  # ...and failed
        return batch

    return map_batch


def idle(seconds: float = 120) -> None:
    """Until no task holds a CPU of the cluster (those a failed write left running have ended)."""
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        assert time.monotonic() < deadline, "tasks still running"
        time.sleep(0.2)


@pytest.mark.parametrize("retries", ["ray's default", "none"])
def test_a_raylet_killed_mid_write(cluster, dataset, tmp_path, retries):
    """Ray's default runs the dead node's write task again elsewhere: the dataset commits exact. With no retries
    the write fails and commits nothing (no dataset, no lease), even with tasks on the other nodes finishing
    their parts after it; and a rerun completes, exact, with nothing staged left."""
    options, bucket, url = dataset
    victim = cluster.add_node(num_cpus=1)
    marker = tmp_path / "holding"
    dest = f"s3://{bucket}/out"
    remote = {"scheduling_strategy": "SPREAD"} | ({"max_retries": 0} if retries == "none" else {})
    others = (dest, options) if retries == "none" else None
    rows = read_atlas(url, storage_options=options).map_batches(
        hold(victim.node_id, str(marker), others), batch_size=100, **remote
    )
    settings = {
        "shard_size": 100,
        "block_size": 10,
        "compression_strategy": ar.CompressionStrategy.STANDARD_COMPRESSION,
    }
    killer = kill_when_holding(cluster, victim, marker)
    if retries == "none":
        with pytest.raises(Exception, match="node"):
            write_atlas(rows, dest, storage_options=options, ray_remote_args=remote, **settings)
        killer.join()
        idle()
        assert marker.exists(), "a write task was mid-part on the killed raylet"
        left = tree(dest, options)  # the parts other nodes finished after the failure may be staged there
        assert all(name.startswith(".atlas-staging/") for name in left), f"nothing committed, no lease: {left}"
        assert not any(name.endswith("/parts.json") for name in left), "the failed run's record deleted"
        with pytest.raises(ar.DatasetNotFoundError):
            ar.open(dest, storage_options=options)
        rows = read_atlas(url, storage_options=options)  # the rerun, on the raylets left
    meta = write_atlas(rows, dest, storage_options=options, ray_remote_args=remote, **settings)
    killer.join()
    assert marker.exists(), "a write task was mid-part on the killed raylet"
    assert sum(meta.shard_sizes) == 4000
    assert sorted(ar.open(dest, storage_options=options), key=lambda row: row["id"]) == ROWS
    assert not any(name.startswith(".atlas") for name in tree(dest, options))
