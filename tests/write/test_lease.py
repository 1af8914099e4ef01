"""The lease's changes are conditional on the version their actor read: one winner among actors taking over a
stale lease, and a renewal that finds the lease changed under it gives up instead of writing over it."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from conftest import SCHEMES

import atlas_remote as ar
from atlas_remote.format.names import LEASE
from atlas_remote.storage import Store
from atlas_remote.write.lease import Lease, read_lease, read_versioned_lease


@pytest.fixture(params=["local", "memory", "s3", "gcs", "azure"])
def place(request, tmp_path, memory_url):
    if request.param == "local":
        return str(tmp_path / "ds"), None
    if request.param == "memory":
        return memory_url, None
    options, bucket, _ = request.getfixturevalue(request.param)
    return f"{SCHEMES[request.param]}://{bucket}/ds", options


def stale_lease(store: Store) -> None:
    """A lease whose holder stopped renewing long ago (its process on another machine, so only time tells)."""
    dead = Lease(store, "dead writer", ttl=1.0)
    dead.record = replace(dead.record, host="elsewhere", renewed=time.time() - 3600)
    assert store.create(LEASE, dead.record.to_json())


def test_of_several_actors_taking_over_a_stale_lease_one_gets_it(place):
    url, options = place
    store = Store(url, options)
    stale_lease(store)
    results: list = []
    start = threading.Barrier(4)

    def take() -> None:
        lease = Lease(Store(url, options), "taker", ttl=60.0)
        start.wait()
        try:
            results.append(lease.acquire())
        except ar.DatasetLockedError as err:
            results.append(err)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, Lease)]
    assert len(winners) == 1, results
    assert all("another writer holds this URL" in str(r) for r in results if not isinstance(r, Lease))
    current = read_lease(store)
    assert current.token == winners[0].record.token and current.generation == 2, "a takeover raises the generation"
    winners[0].release()
    assert read_lease(store) is None


def test_a_renewal_that_finds_the_lease_taken_gives_up_and_fences(place):
    """The writer's renewal thread had read its lease, then froze; meanwhile the lease went stale and another
    actor took it. The renewal must not write over the new lease, and the writer's next fence must stop it."""
    url, options = place
    store = Store(url, options)
    mine = Lease(store, "frozen writer", ttl=0.4).acquire()
    mine._stop.set()  # no background renewal: the test renews by hand, as the frozen thread would
    mine._renewer.join()
    _, seen = read_versioned_lease(store)
    time.sleep(0.5)  # stale now; and the holder is "elsewhere", so only time tells
    mine.record = replace(mine.record, host="elsewhere")
    store.replace(LEASE, mine.record.to_json(), seen)  # what the frozen renewer had just written, before the pause
    mine.version = read_versioned_lease(store)[1]
    taker = Lease(Store(url, options), "recover", ttl=60.0).acquire()
    renewed = replace(mine.record, renewed=time.time())
    assert not store.replace(LEASE, renewed.to_json(), mine.version), "a renewal over the new lease is refused"
    assert read_lease(store).token == taker.record.token
    with pytest.raises(ar.DatasetLockedError, match="taken over"):
        mine.fence()
    mine.release()  # not ours any more: the taker's lease stays
    assert read_lease(store).token == taker.record.token
    taker.release()
    assert read_lease(store) is None


def test_a_fence_costs_one_request(place):
    """check() runs before every destructive commit step: it reads the lease once, with no HEAD for a version."""
    url, options = place
    store = Store(url, options)
    lease = Lease(store, "writer").acquire()
    before = sum(store.stats.requests.values())
    lease.check()
    assert sum(store.stats.requests.values()) - before == 1, store.stats.requests
    lease.release()
