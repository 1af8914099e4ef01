"""Symbolic links inside a local dataset (issue 35, row 10): no command or library call reads, writes or deletes a
file outside the dataset's folder through one. A write replaces a link rather than follow it; a read or a copy of
a link leading out is refused with one line; a link that stays inside is followed, as before. Closed in
storage/local_backend.py, below every command, so commands added later inherit it."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from helpers import same, sample_examples
from helpers import write_dataset as write

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.cli import main
from atlas_remote.storage import Store
from atlas_remote.storage.ranges import ByteRange

EXAMPLES = sample_examples(20)
LINKED_OUT = r"is a symbolic link to .*, or lies under one, outside the dataset's folder"


def run(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out + err


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_index_replaces_a_linked_manifest_and_leaves_what_it_led_to_alone(tmp_path, capsys):
    """`atlas-remote index` wrote its manifest through the link, over the file it led to."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    manifest = tmp_path / "ds" / "atlas_manifest.npz"
    manifest.unlink()
    manifest.symlink_to(victim)
    code, said = run(capsys, "index", url)
    assert victim.read_bytes() == b"precious"
    assert code == 0 and not manifest.is_symlink(), said
    assert len(ar.open(url).manifest) == 2


def test_checksum_refuses_a_dangling_link_out_and_creates_nothing(tmp_path, capsys):
    """`atlas-remote checksum` created a file outside through a dangling block_checksums.npy, and exited 0 (it now
    writes atlas_blocks.npy: the same link under that name)."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2, checksums=False)
    created = tmp_path / "created.npy"
    (tmp_path / "ds" / "0" / "atlas_blocks.npy").symlink_to(created)
    code, said = run(capsys, "checksum", url)
    assert not created.exists()
    assert code == 1 and "0/atlas_blocks.npy is a symbolic link" in said


@pytest.mark.parametrize("dest", ["local", "memory"])
def test_cp_refuses_a_file_linked_out_and_copies_nothing_of_it(tmp_path, memory_url, dest):
    """`atlas-remote cp` copied an outside "credentials" file into the destination (a server-side copy between
    two local folders, a read and a write to memory://)."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2)
    credentials = tmp_path / "credentials"
    credentials.write_bytes(b"aws_secret_access_key = not-for-copying")
    (tmp_path / "ds" / "0" / "zstd_dict.bin").symlink_to(credentials)
    target = str(tmp_path / "copy") if dest == "local" else f"{memory_url}/copy"
    with pytest.raises(ar.FormatError, match="0/zstd_dict.bin " + LINKED_OUT):
        ar.copy_dataset(url, target)
    import fsspec

    fs, root = fsspec.core.url_to_fs(target)
    copied = [fs.cat_file(p) for p in fs.find(root)] if fs.exists(root) else []
    assert not any(b"not-for-copying" in body for body in copied)


@pytest.mark.parametrize("name", ["meta.json", "0/meta.json", "0/index.npy", "0/data.bin", "0/atlas_blocks.npy"])
def test_a_dataset_file_linked_out_is_never_read(tmp_path, name):
    """Each file moved out of the dataset and linked back: it was read as the dataset's own (the reader, verify)."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2)
    (tmp_path / "ds" / "atlas_manifest.npz").unlink()  # so that every file of a shard is read
    outside = tmp_path / "outside" / name.replace("/", "-")
    outside.parent.mkdir()
    shutil.move(tmp_path / "ds" / name, outside)
    (tmp_path / "ds" / name).symlink_to(outside)
    with pytest.raises(ar.FormatError, match=name + " " + LINKED_OUT):
        ar.open(url)[:]
    report = ar.verify(url) if name != "meta.json" else None
    assert report is None or any("symbolic link" in p for p in report.problems)


def test_a_fifo_in_the_dataset_is_refused_not_waited_on(tmp_path):
    """A FIFO named meta.json (an archive may hold one) blocked the reader until something wrote to it; here a
    thread writes the real meta.json into it after 3 s, so the old reader opened the dataset then."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2)
    meta = tmp_path / "ds" / "meta.json"
    text = meta.read_bytes()
    meta.unlink()
    os.mkfifo(meta)

    def feed() -> None:
        time.sleep(3)
        try:
            fd = os.open(meta, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO unless a reader is waiting
        except OSError:
            return
        os.write(fd, text)
        os.close(fd)

    feeder = threading.Thread(target=feed)
    feeder.start()
    started = time.monotonic()
    with pytest.raises(ar.FormatError, match="meta.json is not a regular file"):
        ar.open(url)
    assert time.monotonic() - started < 2
    feeder.join()


def test_a_source_file_linked_out_is_not_converted(tmp_path):
    """convert read a file linked out of the source folder as one of its inputs."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"x": 1}\n')
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"password": "hunter2"}\n')
    (src / "b.jsonl").symlink_to(secret)
    with pytest.raises(ar.FormatError, match="b.jsonl " + LINKED_OUT):
        ar.convert(str(src), str(tmp_path / "out"), from_="jsonl")
    assert not (tmp_path / "out" / "meta.json").exists()


@pytest.fixture
def linked(tmp_path):
    """A store over a folder holding links out: `file` to a file outside, `dangling` to a name outside that does
    not exist, `folder` to a folder outside holding `x`; (store, outside folder, its snapshot)."""
    root, outside = tmp_path / "ds", tmp_path / "outside"
    root.mkdir()
    (outside / "sub").mkdir(parents=True)
    (outside / "victim").write_bytes(b"precious")
    (outside / "sub" / "x").write_bytes(b"kept")
    (root / "file").symlink_to(outside / "victim")
    (root / "dangling").symlink_to(outside / "created")
    (root / "folder").symlink_to(outside / "sub")
    (tmp_path / "mine").write_bytes(b"new bytes")
    return Store(str(root)), outside, snapshot(outside)


WRITES = {
    "write": lambda store, rel, mine: store.write(rel, b"new bytes"),
    "write_stream": lambda store, rel, mine: store.write_stream(rel, [b"new ", b"bytes"]),
    "upload": lambda store, rel, mine: store.upload(mine, rel),
    "create": lambda store, rel, mine: store.create(rel, b"new bytes"),
    "copy_from": lambda store, rel, mine: store.copy_from(Store(os.path.dirname(mine)), "mine", rel),
}


@pytest.mark.parametrize("how", sorted(WRITES))
@pytest.mark.parametrize("rel", ["file", "dangling"])
def test_a_write_replaces_a_link_never_follows_it(linked, tmp_path, how, rel):
    store, outside, before = linked
    if how == "create":  # a conditional create finds the name taken, whatever it leads to
        assert not store.create(rel, b"new bytes")
    else:
        WRITES[how](store, rel, str(tmp_path / "mine"))
        assert not os.path.islink(store.path(rel)) and open(store.path(rel), "rb").read() == b"new bytes"
    assert snapshot(outside) == before and not (outside / "created").exists()


@pytest.mark.parametrize("how", sorted(WRITES))
def test_a_write_under_a_linked_folder_is_refused(linked, tmp_path, how):
    store, outside, before = linked
    with pytest.raises(ar.FormatError, match="folder " + LINKED_OUT):
        WRITES[how](store, "folder/new", str(tmp_path / "mine"))
    assert snapshot(outside) == before


READS = {
    "read": lambda store, rel: store.read(rel, "meta"),
    "read_range": lambda store, rel: store.read_range(ByteRange(rel, 0, 2), "block"),
    "identity": lambda store, rel: store.identity(rel),
    "open_input": lambda store, rel: store.open_input(rel).read(),
    "copy out": lambda store, rel: Store(str(store.path("") + "-copy")).copy_from(store, rel, "x"),
}


@pytest.mark.parametrize("how", sorted(READS))
@pytest.mark.parametrize("rel", ["file", "folder/x"])
def test_a_read_through_a_link_out_is_refused(linked, how, rel):
    store, _, _ = linked
    with pytest.raises(ar.FormatError, match=rel + " " + LINKED_OUT):
        READS[how](store, rel)


def test_deletes_remove_links_not_what_they_lead_to(linked):
    store, outside, before = linked
    with pytest.raises(ar.FormatError, match="folder " + LINKED_OUT):
        store.remove("folder/x")
    for rel in ("file", "dangling", "folder"):
        store.remove(rel)
        assert not os.path.lexists(store.path(rel))
    assert snapshot(outside) == before
    (outside.parent / "ds" / "file").symlink_to(outside / "victim")
    with pytest.raises(ar.FormatError, match="file " + LINKED_OUT):
        store.find()  # what commit, cp and the importers list


def test_links_that_stay_inside_the_dataset_are_followed(tmp_path):
    url = write(str(tmp_path / "ds"), EXAMPLES, 10, 2, compression_strategy=CS.STANDARD_COMPRESSION)
    blobs = tmp_path / "ds" / "blobs"
    blobs.mkdir()
    for name in ("data.bin", "index.npy"):
        shutil.move(tmp_path / "ds" / "0" / name, blobs / name)
        (tmp_path / "ds" / "0" / name).symlink_to(f"../blobs/{name}")
    assert same(ar.open(url)[:], EXAMPLES)
    assert ar.verify(url).problems == []
