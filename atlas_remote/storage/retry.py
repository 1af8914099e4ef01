"""The one retry loop: every request to a remote store goes through it, and no layer below retries.

Transient failures (5xx, dropped connections, timeouts, short bodies) are tried again with full-jitter
exponential backoff, at most `attempts` times in all. A store that says "slow down" (S3 503 SlowDown, 429, GCS
rateLimitExceeded, Azure ServerBusy) is not failing: such answers are retried for as long as they last (up to
THROTTLED_FOR_AT_MOST_SECONDS from the first), not counted against the attempts, while the requests in flight
halve (`Pace`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import (
    AccessDeniedError,
    AtlasError,
    ClientFailedError,
    ObjectNotFoundError,
    RedirectRefusedError,
    StorageError,
    TruncatedReadError,
)
from .errors import throttled_failure

T = TypeVar("T")
BACKOFF_BASE_SECONDS = 0.1
BACKOFF_CAP_SECONDS = 5.0
THROTTLED_FOR_AT_MOST_SECONDS = 120.0


def throttled(error: AtlasError) -> bool:
    """The store asks us to slow down: its answer's status or code says so (storage.errors.throttled_failure; a
    refusal or a missing object never does)."""
    return transient(error) and error.__cause__ is not None and throttled_failure(error.__cause__)


def transient(error: AtlasError) -> bool:
    """Worth another try: network and server failures and short bodies; not missing objects or refusals (the
    store's, or ours of a redirect to another origin)."""
    if isinstance(error, TruncatedReadError):
        return True
    return isinstance(error, StorageError) and not isinstance(
        error, (ObjectNotFoundError, AccessDeniedError, RedirectRefusedError, ClientFailedError)
    )


class Pace:
    """How many requests a store's batched reads keep in flight: additive increase (one more after each batch
    that was not throttled), multiplicative decrease (halved by each batch that was), between 1 and the bound."""

    def __init__(self, bound: int) -> None:
        self.bound, self.limit = bound, float(bound)

    def after(self, throttled: bool) -> None:
        self.limit = max(1.0, self.limit / 2) if throttled else min(float(self.bound), self.limit + 1)

    @property
    def in_flight(self) -> int:
        return int(self.limit)


def with_retries(
    items: list[T],
    attempt: Callable[[list[T]], list],
    attempts: int,
    pace: Pace,
    on_retry: Callable[[int], None],
    remote: bool = True,
) -> list:
    """Run attempt(items), which answers each item with a result or an AtlasError; items that failed transiently
    are tried again, alone, after a backoff, until `attempts` run out (throttled ones without counting, see the
    module). A store that is not remote (a local disk, memory) is tried once. on_retry(n) is told how many go
    again."""
    out: list = [None] * len(items)
    pending = list(range(len(items)))
    tries = [0] * len(items)
    throttled_since: float | None = None
    for n in itertools.count(1):
        again, slowed = [], False
        for i, result in zip(pending, attempt([items[i] for i in pending])):
            out[i] = result
            if not isinstance(result, AtlasError) or not remote:
                continue
            if throttled(result):
                slowed = True
                again.append(i)
            elif transient(result):
                tries[i] += 1
                if tries[i] < attempts:
                    again.append(i)
        pace.after(slowed)
        if slowed:
            throttled_since = throttled_since or time.monotonic()
            if time.monotonic() - throttled_since > THROTTLED_FOR_AT_MOST_SECONDS:
                break
        if not again:
            break
        pending = again
        on_retry(len(again))
        time.sleep(random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** min(n, 10))))
    return out
