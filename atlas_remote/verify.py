"""verify(url): read every block of a dataset and report every problem, not just the first one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import AtlasError
from .reader import AtlasDataset


@dataclass
class VerifyReport:
    url: str
    shards_checked: int = 0
    blocks_checked: int = 0
    examples_checked: int = 0
    blocks_with_checksums: int = 0
    missing_shards: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [
            f"{self.url}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'} - {self.shards_checked} shards, "
            f"{self.blocks_checked} blocks ({self.blocks_with_checksums} with checksums), "
            f"{self.examples_checked} examples decoded"
        ]
        if self.missing_shards:
            lines.append(f"shards not present (not counted as problems): {self.missing_shards}")
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def verify(url: str, storage_options: dict[str, Any] | None = None, *,
           allowed_classes: Iterable[type | str] = (), trusted: bool = False) -> VerifyReport:
    """Open every shard and decode every block, checking sizes, checksums and example counts.

    Each shard is read in large merged windows; a window that fails is read again block by block, so every
    bad block is named. Blocks are decoded with the same pickle policy a reader would use.
    """
    ds = AtlasDataset(url, storage_options, cache_bytes=0, readahead=0,
                      allowed_classes=allowed_classes, trusted=trusted)
    report = VerifyReport(url)
    present = {s.number for s in ds.shards}
    report.missing_shards = [n for n in range(len(ds.meta.shard_sizes)) if n not in present]
    for position, shard in enumerate(ds.shards):
        try:
            ds._open_shard(shard)
        except AtlasError as err:
            report.problems.append(f"shard {shard.name}: {err}")
            continue
        report.shards_checked += 1
        if shard.checksums is not None:
            report.blocks_with_checksums += shard.meta.num_blocks
        start = ds._ends[position - 1] if position else 0
        for keys, _, _ in ds._windows(start, ds._ends[position]):
            try:
                blocks = ds._fetch(keys)
            except AtlasError:
                blocks = {}
                for key in keys:  # find which blocks of the window are bad
                    try:
                        blocks.update(ds._fetch([key]))
                    except AtlasError as err:
                        report.problems.append(str(err))
            report.blocks_checked += len(keys)
            report.examples_checked += sum(len(block.examples) for block in blocks.values())
    return report
