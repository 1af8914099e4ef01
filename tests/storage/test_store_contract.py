"""One contract for every backend (zarr's StoreTests pattern): `StoreTests` holds the tests, and each backend is a
subclass that says where a fresh store lives. Run against the real servers tests/conftest.py starts: local disk,
memory, HTTP (a static server, read-only), S3 (moto; blocks read by obstore, and by s3fs), GCS (the emulator),
Azure (Azurite)."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import unique

import atlas_remote as ar
from atlas_remote.storage import Store, StoreSettings
from atlas_remote.storage import obstore_backend as obstore_module
from atlas_remote.storage.ranges import ByteRange

OURS = ("atlas-store", "atlas-obstore", "atlas-open")  # the thread names of every pool a reader makes
BODY = bytes(range(256)) * 40  # 10,240 bytes


def our_threads() -> list[threading.Thread]:
    """Our threads as objects: names repeat across stores (every store's pool names its threads alike), so a
    thread made here can have the name of one an earlier test's store left running."""
    return [t for t in threading.enumerate() if t.name.startswith(OURS)]


class StoreTests:
    """What every backend must do. A subclass gives `place` (the URL of a fresh, empty root, its options) and, for
    a store nothing can be written to, `put` (objects placed there behind the store's back)."""

    writable = True  # False: HTTP serves files it cannot write
    lists = True
    read_client = ""  # which client reads blocks ("obstore", "fsspec", "local")

    @pytest.fixture
    def place(self, request: Any) -> tuple[str, dict | None]:
        raise NotImplementedError

    def put(self, store: Store, rel: str, data: bytes) -> None:
        store.write(rel, data)

    @pytest.fixture
    def store(self, place: tuple[str, dict | None]) -> Any:
        url, options = place
        with Store(url, options, StoreSettings(retries=1, timeout=30)) as store:
            yield store

    def test_the_client_is_the_one_expected(self, store):
        assert store.read_client == self.read_client
        assert store.can_list is self.lists

    def test_a_whole_object_reads_back(self, store):
        self.put(store, "a/x.bin", BODY)
        assert store.read("a/x.bin", "meta") == BODY
        assert store.snapshot().requests["meta"] == 1 and store.snapshot().bytes["meta"] == len(BODY)

    def test_a_missing_object_is_not_found_and_not_retried(self, store):
        with pytest.raises(ar.ObjectNotFoundError):
            store.read("nothing/here.json", "meta")
        assert store.snapshot().retries == 0
        assert not store.exists("nothing/here.json")

    def test_ranges_read_back_merged_when_they_touch(self, store):
        self.put(store, "data.bin", BODY)
        ranges = [ByteRange("data.bin", 0, 100), ByteRange("data.bin", 100, 300), ByteRange("data.bin", 5000, 5001)]
        got = store.read_ranges(ranges, "block")
        assert {r: bytes(got[r]) for r in ranges} == {r: BODY[r.start : r.end] for r in ranges}
        assert store.snapshot().requests["block"] == 2  # the touching pair in one request
        assert bytes(store.read_range(ByteRange("data.bin", 10, 20), "block")) == BODY[10:20]

    def test_a_range_past_the_end_is_never_handed_on_short(self, store):
        self.put(store, "data.bin", BODY)
        with pytest.raises((ar.TruncatedReadError, ar.StorageError)):
            store.read_ranges([ByteRange("data.bin", len(BODY) - 10, len(BODY) + 10)], "block")

    def test_identity_gives_the_size_and_a_version(self, store):
        self.put(store, "data.bin", BODY)
        identity = store.identity("data.bin")
        assert identity.size == len(BODY) and identity.url == store.url_of("data.bin")
        assert identity.version or not store.capabilities.conditional

    def test_a_rewritten_object_is_not_read_as_the_version_expected(self, store, place):
        """Reads made conditional on a version (expect) never return another version's bytes: they fail with
        DatasetChangedError, or (a local file kept open) still read the version expected."""
        self.put(store, "data.bin", BODY)
        store.expect("data.bin", store.identity("data.bin"))
        assert bytes(store.read_range(ByteRange("data.bin", 0, 10), "block")) == BODY[:10]
        self.put(store, "data.bin", BODY[::-1])
        assert store.capabilities.conditional
        try:
            got = store.read_ranges([ByteRange("data.bin", 0, 10)], "block")
        except ar.DatasetChangedError:
            pass
        else:
            assert bytes(got[ByteRange("data.bin", 0, 10)]) == BODY[:10]
        with Store(*place) as fresh:
            assert bytes(fresh.read_range(ByteRange("data.bin", 0, 10), "block")) == BODY[::-1][:10]

    def test_listings_name_what_is_there(self, store):
        for rel in ("0/meta.json", "0/data.bin", "1/meta.json", "meta.json"):
            self.put(store, rel, b"{}")
        if not self.lists:
            with pytest.raises(ar.StorageError, match="read-only"):
                store.require_writable()
            return
        assert store.list_names() == ["0", "1", "meta.json"]
        assert sorted(store.find()) == ["0/data.bin", "0/meta.json", "1/meta.json", "meta.json"]
        assert store.is_folder("0") and not store.is_folder("meta.json")

    def test_a_store_pickles_to_its_url_and_reads_the_same(self, store):
        self.put(store, "meta.json", b'{"a": 1}')
        again = pickle.loads(pickle.dumps(store))
        assert again.url == store.url and again.read("meta.json", "meta") == b'{"a": 1}'
        again.close()

    def test_close_ends_every_thread_the_store_made(self, store):
        self.put(store, "data.bin", BODY)
        before = set(our_threads())
        assert store.beside(store.identity, "data.bin").result().size == len(BODY)
        store.read_ranges([ByteRange("data.bin", i * 100, i * 100 + 50) for i in range(8)], "block")
        assert set(our_threads()) - before, "the store made threads of its own"
        store.close()
        assert set(our_threads()) <= before
        assert store.read("data.bin", "meta") == BODY  # usable after, making what it needs again
        store.close()


class WritableStoreTests(StoreTests):
    """What every store that can be written to must do: conditional creates, replaces and deletes."""

    def test_create_only_if_absent(self, store):
        assert store.create("lease.json", b"one")
        assert not store.create("lease.json", b"two")
        assert store.read("lease.json", "meta") == b"one"

    def test_replace_and_remove_only_at_the_version_read(self, store):
        store.write("lease.json", b"one")
        body, version = store.read_versioned("lease.json", "meta")
        assert body == b"one"
        assert store.replace("lease.json", b"two", version)
        assert not store.replace("lease.json", b"three", version), "the version read is gone"
        assert store.read("lease.json", "meta") == b"two"
        assert not store.remove_if("lease.json", version)
        assert store.remove_if("lease.json", store.identity("lease.json").version)
        assert not store.exists("lease.json")

    def test_streams_uploads_and_removal(self, store, tmp_path):
        assert store.write_stream("big.bin", [BODY[:5000], BODY[5000:]]) == len(BODY)
        source = tmp_path / "up.bin"
        source.write_bytes(BODY[:99])
        store.upload(str(source), "up/up.bin")
        assert store.read("big.bin", "meta") == BODY and store.read("up/up.bin", "meta") == BODY[:99]
        store.remove("up")
        store.remove("up")  # a missing one is not an error
        assert not store.exists("up/up.bin")


class TestLocal(WritableStoreTests):
    read_client = "local"

    @pytest.fixture
    def place(self, tmp_path):
        return str(tmp_path / "root"), None


class TestMemory(WritableStoreTests):
    read_client = "fsspec"

    @pytest.fixture
    def place(self, memory_url):
        return memory_url, None


class TestHTTP(StoreTests):
    writable, lists, read_client = False, False, "fsspec"

    @pytest.fixture
    def place(self, http_root):
        base, root = http_root
        folder = unique("contract")
        (root / folder).mkdir()
        self.folder = Path(root / folder)
        return f"{base}/{folder}", None

    def put(self, store: Store, rel: str, data: bytes) -> None:
        target = self.folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_suffix(".tmp")
        staged.write_bytes(data)
        staged.replace(target)  # a new file, as a writer makes it: a new ETag


class TestS3(WritableStoreTests):
    read_client = "obstore"

    @pytest.fixture
    def place(self, s3):
        options, bucket, _ = s3
        return f"s3://{bucket}/root", options


class TestS3ThroughS3fs(WritableStoreTests):
    read_client = "fsspec"

    @pytest.fixture
    def place(self, s3, monkeypatch):
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
        options, bucket, _ = s3
        return f"s3://{bucket}/root", options


class TestGCS(WritableStoreTests):
    read_client = "fsspec"

    @pytest.fixture
    def place(self, gcs):
        options, bucket, _ = gcs
        return f"gs://{bucket}/root", options


class TestAzure(WritableStoreTests):
    read_client = "obstore"

    @pytest.fixture
    def place(self, azure):
        options, container, _ = azure
        return f"az://{container}/root", options


def test_a_dataset_closed_leaves_no_thread_of_ours(place):
    """`with ar.open(url) as ds:` ends the store's helpers, obstore's pool and the shard opener (they ended only
    at exit)."""
    from helpers import same, sample_examples

    url, options = place
    examples = sample_examples(60)
    with ar.AtlasDatasetWriter(url, 20, 5, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    before = set(our_threads())
    with ar.open(url, storage_options=options) as ds:
        ds.table.prefetch(list(ds.shards))
        assert same(list(ds), examples)
        assert set(our_threads()) - before, "reading made threads of ours"
    assert set(our_threads()) <= before
    assert same(ds[7], examples[7])  # still readable, making them again
    ds.close()
    assert set(our_threads()) <= before


def test_a_local_reader_imports_no_cloud_client(tmp_path):
    """connect() imports the backend a URL needs, and only it: reading a local folder loads no S3, GCS, Azure or
    obstore module (they were all imported with the package)."""
    import subprocess
    import sys

    script = (
        "import sys, atlas_remote as ar\n"
        "with ar.AtlasDatasetWriter(sys.argv[1], 10, 2) as w:\n"
        "    [w.add_example(i) for i in range(5)]\n"
        "assert ar.open(sys.argv[1])[:] == list(range(5))\n"
        "clouds = ('s3fs', 'gcsfs', 'adlfs', 'obstore', 'botocore', 'azure')\n"
        "backends = ('s3_backend', 'gcs_backend', 'azure_backend', 'obstore_backend', 'obstore_config')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in clouds or m.rpartition('.')[2] in backends))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ds")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
