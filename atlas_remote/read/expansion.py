"""What a consumer may make of the examples it is handed: the bound every consumer that copies what it walks
(JSON lines, the viewer's page, rows for Arrow, Parquet, pandas and Hugging Face) applies before it walks.

The unpickler bounds what a block *holds* (docs/security.md). A consumer that copies a value copies a shared
object each time it reaches it: one block of 100 references to one 8 MiB string holds 8 MiB and, as JSON or
Arrow, is 800 MiB (one level more, 80 GiB). So an example from a stranger's block is measured as reached
(`trust.measure.expanded`): up to FLOOR_BYTES it is taken as it is; past that it may expand to EXPANSION times what
it holds, plus FLOOR_BYTES, and no deeper than the consumer walks. A block your key signed, or a reader told
`trusted=True`, is your own data: not measured (its structure was made by your writer, as the walk of the
opcodes is skipped for it). Examples of one block are measured together, one walk a block: per-example walks
happen only when a block's examples are past FLOOR_BYTES, to name the one refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ExpansionError
from ..trust.measure import expanded, held_in_memory

if TYPE_CHECKING:
    from .reader import AtlasDataset
    from .shards import BlockKey

FLOOR_BYTES = 64 << 20  # what any example, or a block's examples together, may expand to
EXPANSION = 4  # ...and past that, as many times what the example holds
MOST_DEPTH = 200  # levels of references a consumer that recurses per level walks (JSON: two Python frames a level)


def measured(value: Any, most_depth: int = MOST_DEPTH, cuts: bool = False) -> tuple[int, str | None]:
    """(what `value` expands to, as far as measured; what is wrong with handing it to a consumer that copies all
    it walks, or None). A consumer that `cuts` what lies deeper than most_depth (the viewer) is not refused for
    depth: what lies below is not walked."""
    reached = expanded(value, FLOOR_BYTES, most_depth)
    if reached.whole or cuts and reached.depth > most_depth:
        return reached.bytes, None
    if reached.depth > most_depth:
        return reached.bytes, _too_deep(most_depth)
    held = held_in_memory([value])
    limit = FLOOR_BYTES + EXPANSION * held
    reached = expanded(value, limit, most_depth)
    if reached.whole or cuts and reached.depth > most_depth:
        return reached.bytes, None
    if reached.depth > most_depth:
        return reached.bytes, _too_deep(most_depth)
    return reached.bytes, (
        f"walked whole (a value it refers to many times copied each time) it makes more than {limit:,} bytes from "
        f"the {held:,} it holds: a stranger's block built to exhaust memory, or data that shares values; read it "
        f"with ds[i] and take what you need, or sign the dataset if it is yours (atlas-remote checksum)"
    )


def _too_deep(most_depth: int) -> str:
    return (
        f"its values nest more than {most_depth - 2:,} containers deep, past what this takes; read it with ds[i] "
        f"(the reader serves it) and flatten it"
    )


def vouched(ds: AtlasDataset, key: BlockKey) -> bool:
    """A block of the reader's own (a shard signed with its key), or a reader that trusts everything."""
    return ds.policy.trusted or ds.table.state(key[0]).signer is not None


def sizes(ds: AtlasDataset, key: BlockKey, first: int, values: list, most_depth: int = MOST_DEPTH) -> list[int]:
    """What each of a block's `values` (example `first` on) expands to, for a consumer that holds several at once:
    one walk of them all when they come to at most FLOOR_BYTES together (all counted on the first), else each
    measured; 0 for a block of the reader's own. ExpansionError, naming the example, for one refused."""
    if vouched(ds, key):
        return [0] * len(values)
    together, found = measured(values, most_depth + 1)
    if found is None and together <= FLOOR_BYTES:
        return [together] + [0] * (len(values) - 1)
    out = []
    for index, value in enumerate(values, first):
        size, found = measured(value, most_depth)
        if found is not None:
            raise _error(ds, key, index, found)
        out.append(size)
    return out


def checked(ds: AtlasDataset, index: int, value: Any, most_depth: int = MOST_DEPTH, cuts: bool = False) -> Any:
    """`value`, example `index`, if a consumer may walk it whole (to most_depth, past which it `cuts`, or else
    refuses); else ExpansionError naming it."""
    key, _ = ds.locate(index)
    if not vouched(ds, key):
        found = measured(value, most_depth, cuts)[1]
        if found is not None:
            raise _error(ds, key, index, found)
    return value


def checked_range(ds: AtlasDataset, start: int, stop: int, most_depth: int = MOST_DEPTH) -> Iterator[Any]:
    """Examples start..stop in order (read-ahead as `ds.iter`), each checked as `sizes` says."""
    for key, first, values in ds.located_slices(start, stop):
        sizes(ds, key, first, values, most_depth)
        yield from values


def _error(ds: AtlasDataset, key: BlockKey, index: int, found: str) -> ExpansionError:
    return ExpansionError(f"example {index:,}: {found}", url=ds.url, shard=ds.shards[key[0]].name, block=key[1])
