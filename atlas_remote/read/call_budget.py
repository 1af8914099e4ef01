"""What one call of the reader may hand back (`ds[a:b]`, `get_many`, a viewer's page): at most max_block_bytes,
as one block may. A call whose blocks declare more than that together has them decoded one at a time, what it
keeps of each measured, instead of every block of the call in memory at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ExpansionError
from ..trust.measure import held_in_memory

if TYPE_CHECKING:
    from .blocks import BlockLoader
    from .shards import BlockKey


class OverBudget(Exception):
    """Blocks a call fetched that declare more than its budget (BlockLoader.get): their stored bytes."""

    def __init__(self, raw: Any) -> None:
        super().__init__("past the call's budget")
        self.raw = raw


def take(loader: BlockLoader, located: list[tuple[BlockKey, int]], indices: list[int], raw: Any, budget: int) -> list:
    """The examples at (block, slot), in order, for a call whose blocks declare more than `budget` bytes
    together: each block decoded in turn (from `raw`, or the memory cache), the examples asked for taken and
    the block let go (kept in the memory cache within its bound), what is taken measured (held_in_memory) and
    refused past `budget`: ExpansionError naming the example, never every block of the call in memory at
    once (twenty blocks of 200 MB of zeros, 6 KB stored each: 2.7 GB, then a MemoryError)."""
    wanted: dict[BlockKey, list[int]] = {}
    for position, (key, _) in enumerate(located):
        wanted.setdefault(key, []).append(position)
    out: list = [None] * len(located)
    kept = 0
    for key, positions in wanted.items():
        block = loader.memory.get(key)
        if block is None:
            where, data, _ = raw[key] if key in raw else loader.fetch_raw([key])[key]
            block = loader.decode(key, where, data)
            loader.memory.put(key, block)
        taken = [block.examples[located[p][1]] for p in positions]
        del block
        kept += held_in_memory(taken)
        if kept > budget:
            raise ExpansionError(
                f"example {indices[positions[0]]:,}: the {len(located):,} examples asked for in one call hold "
                f"more than {budget:,} bytes (max_block_bytes, what one call may hand back): ask for fewer at a "
                f"time, or iterate (ds.iter)",
                url=loader.table.url,
                shard=loader.table.state(key[0]).name,
                block=key[1],
            )
        for p, example in zip(positions, taken):
            out[p] = example
    return out
