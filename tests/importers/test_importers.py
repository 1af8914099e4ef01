"""Importers and `convert`: each source format read by hand, compared with what its own library reads, converted
locally and over S3 with one worker and two, resumed after a kill, and refused clearly when malformed.

Fixtures are made here: WebDataset shards with webdataset's TarWriter, an L5Kit-shaped store with zarr 2 and
L5Kit's dtypes, Megatron .idx/.bin and Dolma JSON lines written to their documented layouts.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest
import zstandard
from conftest import LOCAL_QUICK
from helpers import crash_env, interruptible, same, tree
from source_files import make_dolma, make_jsonl, make_megatron, make_webdataset, make_zarr, sources

import atlas_remote as ar
from atlas_remote.importers import dolma, jsonl, megatron, webdataset
from atlas_remote.importers import zarr as zarr_importer

# -- fixtures: each format as its writer lays it out ----------------------------------------------------


# -- reading --------------------------------------------------------------------------------------


def test_webdataset_groups_as_webdataset_does(tmp_path):
    import webdataset as wds

    urls = make_webdataset(tmp_path)
    # a tar with the rules' corner cases: folders, several dots, upper case, a non-adjacent key, __meta__, dirs
    odd = tmp_path / "odd.tar"
    with tarfile.open(odd, "w") as tar:
        for name, data in (
            ("__meta__", b"skip"),
            ("dir/a.left.JPG", b"1"),
            ("dir/a.json", b"2"),
            ("dir/b.txt", b"3"),
            ("dir/a.cls", b"4"),
            ("noext", b"5"),
            ("dir/__x__/c.txt", b"6"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("emptydir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    sources = urls + [str(odd)]
    theirs = [
        {k: v for k, v in s.items() if k != "__local_path__"} for s in wds.WebDataset(sources, shardshuffle=False)
    ]
    ours = list(webdataset.samples(sources))
    assert ours == theirs and len(ours) == 3 * 40 + 4
    assert ours[-3] == {"__key__": "dir/b", "__url__": str(odd), "txt": b"3"}
    assert [s["__key__"] for s in ours[-4:]] == [
        "dir/a",
        "dir/b",
        "dir/a",
        "dir/__x__/c",
    ]  # only a leading __x__ is meta
    assert ours[-4] == {"__key__": "dir/a", "__url__": str(odd), "left.jpg": b"1", "json": b"2"}
    assert webdataset.inputs(str(tmp_path / "train-{000000..000002}.tar")) == urls


def test_webdataset_duplicate_suffix_names_tar_and_member(tmp_path):
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("k.jpg", "k.JPG"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ar.FormatError, match="member 'k.JPG': a second 'jpg' in sample 'k'") as bad:
        list(webdataset.samples(str(path)))
    assert bad.value.url == str(path)


def test_megatron_dolma_zarr_jsonl_read_back(tmp_path):
    expected = make_megatron(tmp_path / "corpus_text_document")
    assert same(list(megatron.samples(str(tmp_path / "corpus_text_document.idx"))), expected)
    (tmp_path / "dolma").mkdir()
    expected = make_dolma(tmp_path / "dolma")
    assert list(dolma.samples(str(tmp_path / "dolma"))) == expected
    only = list(dolma.samples(str(tmp_path / "dolma"), attributes=["lang"]))
    assert only[3]["attributes"] == {"own": 3, "lang": {"en": 0.9}}
    expected = make_zarr(tmp_path / "scenes.zarr")
    assert same(list(zarr_importer.samples(str(tmp_path / "scenes.zarr"))), expected)
    (tmp_path / "j").mkdir()
    rows = make_jsonl(tmp_path / "j")
    assert list(jsonl.samples(str(tmp_path / "j" / "*.jsonl*"))) == rows


def test_zarr_reads_every_chunk_once(tmp_path, monkeypatch):
    make_zarr(tmp_path / "scenes.zarr")
    reads = []
    original = zarr_importer.ZarrArray.read_chunk
    monkeypatch.setattr(
        zarr_importer.ZarrArray,
        "read_chunk",
        lambda self, n: reads.append((self.url.rsplit("/", 1)[1], n)) or original(self, n),
    )
    list(zarr_importer.samples(str(tmp_path / "scenes.zarr")))
    assert len(reads) == len(set(reads)), "no chunk read twice"
    assert {name for name, _ in reads} == {"scenes", "frames", "agents", "traffic_light_faces"}


# -- bad input: a clear error naming the file, nothing committed ------------------------------------


def bad_sources(tmp_path):
    """(format, source, what the error names, message) for each kind of malformed input."""
    urls = make_webdataset(tmp_path, shards=1)
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(open(urls[0], "rb").read()[:3000])
    cases = [("webdataset", str(truncated), str(truncated), "not a readable tar archive")]
    for field, offset, value, message in (
        ("magic", 0, b"NOTMAGIC\x00", "bad magic"),
        ("version", 9, struct.pack("<Q", 2), "unsupported version 2"),
        ("dtype", 17, b"\x09", "unknown dtype code 9"),
    ):
        prefix = tmp_path / f"bad-{field}"
        make_megatron(prefix)
        raw = bytearray(open(f"{prefix}.idx", "rb").read())
        raw[offset : offset + len(value)] = value
        open(f"{prefix}.idx", "wb").write(bytes(raw))
        cases.append(("megatron", str(prefix), f"{prefix}.idx", message))
    short = tmp_path / "short"
    make_megatron(short)
    open(f"{short}.bin", "r+b").truncate(1000)
    cases.append(("megatron", str(short), f"{short}.bin", "shorter than its .idx pointers"))
    make_dolma(tmp_path / "dolma")
    attribute = tmp_path / "dolma" / "attributes" / "lang" / "2019-10" / "0106_vi.jsonl.zst"
    rows = zstandard.decompress(attribute.read_bytes()).decode().splitlines()
    rows[6], rows[7] = rows[7], rows[6]
    attribute.write_bytes(zstandard.compress("\n".join(rows).encode()))
    cases.append(("dolma", str(tmp_path / "dolma"), str(attribute), "line 7: id .* out of step"))
    make_zarr(tmp_path / "scenes.zarr")
    os.remove(tmp_path / "scenes.zarr" / "agents" / "2")
    cases.append(
        ("zarr", str(tmp_path / "scenes.zarr"), str(tmp_path / "scenes.zarr" / "agents" / "2"), "chunk 2 is missing")
    )
    (tmp_path / "broken.jsonl").write_text('{"a": 1}\n{"a": \n')
    cases.append(("jsonl", str(tmp_path / "broken.jsonl"), str(tmp_path / "broken.jsonl"), "line 2: JSONDecodeError"))
    return cases


def test_malformed_sources_are_named_and_nothing_is_committed(tmp_path):
    for source_format, src, named, message in bad_sources(tmp_path):
        dest = tmp_path / f"out-{source_format}"
        with pytest.raises(ar.FormatError, match=message) as bad:
            ar.convert(src, str(dest), source_format, shard_size=20, block_size=4)
        assert bad.value.url == named, (source_format, str(bad.value))
        with pytest.raises(ar.DatasetNotFoundError):
            ar.open(str(dest))
        assert not (dest / ".atlas-lease").exists()


# -- converting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("place", LOCAL_QUICK, indirect=True)  # to S3: format/test_manifest.py's convert, quick
def test_convert_every_format_with_one_and_two_workers(tmp_path, place):
    base, options = place
    for source_format, (src, expected) in sources(tmp_path).items():
        results = []
        for workers in (1, 2):
            dest = f"{base}/{source_format}-{workers}"
            report = ar.convert(
                src, dest, source_format, shard_size=30, block_size=4, workers=workers, dest_options=options
            )
            assert report.examples == len(expected)
            assert same(ar.open(dest, storage_options=options)[:], expected), source_format
            results.append(tree(dest, options))
        assert results[0] == results[1], f"{source_format}: the same dataset whatever the number of workers"


def test_a_source_over_s3(s3, tmp_path):
    options, bucket, fs = s3
    (tmp_path / "dolma").mkdir()
    expected = make_dolma(tmp_path / "dolma")
    fs.put(str(tmp_path / "dolma"), f"{bucket}/dolma", recursive=True)
    report = ar.convert(
        f"s3://{bucket}/dolma", str(tmp_path / "out"), "dolma", shard_size=10, block_size=2, src_options=options
    )
    assert report.inputs == 2 and ar.open(str(tmp_path / "out"))[:] == expected


KILLED_CONVERT = textwrap.dedent("""
    import sys
    import atlas_remote as ar
    ar.convert(sys.argv[1], sys.argv[2], "jsonl", shard_size=7, block_size=2, workers=int(sys.argv[3]))
""")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_conversion_resumes_to_the_same_dataset(tmp_path, workers):
    folder = tmp_path / "src"
    folder.mkdir()
    for n in range(5):
        (folder / f"{n}.jsonl").write_text("".join(json.dumps({"n": n, "i": i}) + "\n" for i in range(20)))
    src = str(folder / "*.jsonl")
    ar.convert(src, str(tmp_path / "whole"), "jsonl", shard_size=7, block_size=2)
    run = subprocess.run(
        [sys.executable, "-c", KILLED_CONVERT, src, str(tmp_path / "resumed"), str(workers)],
        env=crash_env(kill_at="part-2-staged"),
        capture_output=True,
        timeout=120,
    )
    assert run.returncode != 0, "killed after staging part 2"
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "resumed"))
    report = ar.convert(src, str(tmp_path / "resumed"), "jsonl", shard_size=7, block_size=2, resume=True)
    assert report.inputs_resumed >= 1
    assert tree(str(tmp_path / "resumed")) == tree(str(tmp_path / "whole")), "identical to an uninterrupted run"


def test_convert_command(tmp_path):
    (tmp_path / "j").mkdir()
    rows = make_jsonl(tmp_path / "j")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas_remote.cli",
            "convert",
            str(tmp_path / "j" / "a.jsonl.gz"),
            str(tmp_path / "j" / "b.jsonl"),
            str(tmp_path / "out"),
            "--from",
            "jsonl",
            "--shard-size",
            "25",
            "--block-size",
            "5",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "70 examples in 4 shards" in result.stdout  # 40 + 30: shards never span two inputs
    assert ar.open(str(tmp_path / "out"))[:] == rows


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_conversion_leaves_no_worker_behind_and_resumes_to_the_same_bytes(tmp_path):
    """SIGKILL of `convert --workers 2` once left both spawn workers running, uploading into staging, and
    multiprocessing's resource tracker printed a "leaked semaphore" warning."""
    folder = tmp_path / "src"
    folder.mkdir()
    for n in range(4):
        (folder / f"{n}.jsonl").write_text("".join(json.dumps({"n": n, "i": i}) + "\n" for i in range(2500)))
    ar.convert(str(folder), str(tmp_path / "whole"), "jsonl")
    command = [sys.executable, "-m", "atlas_remote.cli", "convert", str(folder), str(tmp_path / "out")]
    command += ["--from", "jsonl", "--workers", "2", "--quiet", "--map", "tables_maps:slowly"]  # 1 ms an example
    with open(tmp_path / "stderr", "w") as stderr:
        convert = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=os.path.dirname(os.path.dirname(__file__))
        )
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while len(workers) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
        workers = children_of(convert.pid)
        time.sleep(0.05)
    assert len(workers) >= 3 and convert.poll() is None, "the conversion ended before its workers were seen"
    time.sleep(1.0)  # the workers are converting
    convert.kill()
    convert.wait()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)], "workers outlived their parent by 5 s"
    assert "leaked" not in (tmp_path / "stderr").read_text(), (tmp_path / "stderr").read_text()
    resumed = subprocess.run(
        [*command, "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(__file__)),
        env={**os.environ, "ATLAS_TEST_SLOWLY": "0"},  # the rest at full speed
    )
    assert resumed.returncode == 0, resumed.stderr
    assert tree(str(tmp_path / "out")) == tree(str(tmp_path / "whole")), "identical to an uninterrupted run"


def test_ctrl_c_during_a_conversion_says_how_to_resume(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "rows.jsonl").write_text((json.dumps({"i": 1}) + "\n") * 100_000)
    convert = subprocess.Popen(
        [sys.executable, "-m", "atlas_remote.cli", "convert", str(tmp_path / "src"), str(tmp_path / "out")]
        + ["--from", "jsonl", "--quiet", "--map", "tables_maps:slowly"],  # 1 ms an example: still at it below
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
        preexec_fn=interruptible,  # see helpers.interruptible
    )
    deadline = time.monotonic() + 120  # converting once its staging folder is there (a busy machine imports slowly)
    while not (tmp_path / "out" / ".atlas-staging").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    convert.send_signal(signal.SIGINT)
    try:
        _, err = convert.communicate(timeout=60)
    finally:
        convert.kill()  # nothing left behind if it did not stop
    assert convert.returncode == 130 and "--resume" in err, (convert.returncode, err)
