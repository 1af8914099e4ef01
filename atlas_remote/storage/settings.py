"""What a `Store` is told: its own settings value, so that storage depends on nothing above it (a reader's
`ReaderOptions.storage` makes one from the reader's settings)."""

from __future__ import annotations

from dataclasses import dataclass

# The largest block a reader accepts by default: the same figure as codec.DEFAULT_MAX_BLOCK_BYTES (a unit test
# holds them equal; storage does not import the codec).
DEFAULT_MAX_BLOCK_BYTES = 1 << 30


@dataclass(frozen=True)
class StoreSettings:
    """max_concurrency: requests in flight at once. retries, timeout: each request to a remote store is tried up
    to retries + 1 times (transient failures only), each within timeout seconds. max_block_bytes: the bound of a
    whole object whose kind has no bound of its own. max_gap_bytes, max_merged_bytes: how ranged reads merge."""

    max_concurrency: int = 32
    retries: int = 4
    timeout: float = 60.0
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    max_gap_bytes: int = 0
    max_merged_bytes: int = 8 * 1024 * 1024
