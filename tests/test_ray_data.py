"""Ray Data (work in progress, issue 13): read_atlas and write_atlas round trips on one local Ray session."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")  # the [ray] extra; CI does not install it yet (the branch is not merged)

import atlas_remote as ar  # noqa: E402
from atlas_remote.ray_data import read_atlas, write_atlas  # noqa: E402
from spec_reader import SpecReader  # noqa: E402


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.mark.parametrize("kind", ["dict", "int"])
def test_read_atlas_gives_every_example_once(ray_session, tmp_path, kind):
    with ar.AtlasDatasetWriter(str(tmp_path / "src"), 1000, 32) as w:
        for i in range(5000):
            w.add_example({"id": i, "text": f"x{i}"} if kind == "dict" else i)
    rows = read_atlas(str(tmp_path / "src")).take_all()
    assert sorted(r["id"] if kind == "dict" else r["item"] for r in rows) == list(range(5000))


def test_write_atlas_round_trip(ray_session, tmp_path):
    rows = [{"id": i, "text": f"x{i}"} for i in range(5000)]
    write_atlas(ray.data.from_items(rows, override_num_blocks=8), str(tmp_path / "out"), shard_size=1000, block_size=32)
    assert list(ar.open(str(tmp_path / "out"))) == rows
    assert SpecReader(tmp_path / "out").all() == rows


def test_a_failed_write_leaves_nothing(ray_session, tmp_path):
    def explode(row):
        if row["id"] == 3333:
            raise ValueError("bad row")
        return row

    source = ray.data.from_items([{"id": i} for i in range(5000)], override_num_blocks=8).map(explode)
    with pytest.raises(Exception, match="bad row"):
        write_atlas(source, str(tmp_path / "out"), shard_size=1000, block_size=32,
                    compression_strategy=ar.CompressionStrategy.STANDARD_COMPRESSION)
    left = sorted(p.name for p in (tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    assert left == [], left
