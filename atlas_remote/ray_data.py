"""Ray Data: an Atlas dataset read as a `ray.data.Dataset`, and written from one with a single commit.

Work in progress (issue 13): read and write paths only; no CLI engine, benchmarks or docs yet.

Reading: one read task per run of blocks (whole shards when they are small), each carrying its row count;
a task opens the dataset in its worker and reads its range with the sequential path (merged reads,
read-ahead). A dict example is the row; any other example becomes {"item": example}, as in
`ray.data.from_items`.

Writing: the Atlas commit model is Ray's Datasink lifecycle. `on_write_start` takes the URL's lease and a
staging folder (StagedParts); each write task writes its rows as one staged part (PartSpec.write, whole
shards); `on_write_complete` commits once, shards numbered in task order, root meta.json last;
`on_write_failed` discards the staging and gives the URL back.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

try:
    import ray
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
except ImportError as err:  # pragma: no cover - exercised only without ray
    raise ImportError("atlas_remote.ray_data needs Ray Data: pip install 'atlas_remote[ray]'") from err

from .convert import _first_shard_dictionary
from .format import CompressionStrategy
from .reader import open as open_dataset
from .writer import ShardSettings, StagedParts

ROWS_PER_TASK = 100_000  # a read task's share when shards are larger: enough to amortise opening


def _row(example: Any) -> dict:
    return example if isinstance(example, dict) else {"item": example}


def _example(row: dict) -> Any:
    return row["item"] if row.keys() == {"item"} else row


def _block(rows: list[dict]):
    # Ray's own builder: it picks Arrow or pandas and keeps objects Arrow cannot hold (as from_items does).
    from ray.data._internal.delegating_block_builder import DelegatingBlockBuilder

    builder = DelegatingBlockBuilder()
    for row in rows:
        builder.add(row)
    return builder.build()


class AtlasDatasource(Datasource):
    def __init__(self, url: str, storage_options: dict | None = None, rows_per_block: int = 4096, **settings: Any):
        super().__init__()
        self.url, self.storage_options, self.settings = url, storage_options, settings
        self.rows_per_block = rows_per_block
        ds = open_dataset(url, storage_options=storage_options, **settings)
        self.ranges = [(shard.start + i, shard.start + min(i + ROWS_PER_TASK, shard.size))
                       for shard in ds.shards for i in range(0, shard.size, ROWS_PER_TASK)]

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, **_: Any) -> list[ReadTask]:
        url, options, settings, rows_per_block = self.url, self.storage_options, self.settings, self.rows_per_block

        def read(start: int, stop: int) -> Iterator:
            ds = open_dataset(url, storage_options=options, **settings)
            rows: list[dict] = []
            for example in ds.iter(start, stop):
                rows.append(_row(example))
                if len(rows) == rows_per_block:
                    yield _block(rows)
                    rows = []
            if rows:
                yield _block(rows)

        return [ReadTask(lambda start=start, stop=stop: read(start, stop),
                         BlockMetadata(num_rows=stop - start, size_bytes=None, input_files=None, exec_stats=None))
                for start, stop in self.ranges]

    def get_name(self) -> str:
        return "Atlas"


class AtlasDatasink(Datasink):
    def __init__(self, url: str, settings: ShardSettings, storage_options: dict | None = None,
                 overwrite: bool = False, dictionary: bytes | None = None) -> None:
        self.url, self.settings, self.storage_options = url, settings, storage_options
        self.overwrite, self.dictionary = overwrite, dictionary
        self.staged: StagedParts | None = None
        self.spec = None

    def on_write_start(self, schema: Any = None) -> None:
        self.staged = StagedParts(self.url, self.settings, self.storage_options, dictionary=self.dictionary,
                                  overwrite=self.overwrite, job={"engine": "ray"})
        self.spec = self.staged.spec(0)

    def __getstate__(self) -> dict:
        """Write tasks get the part spec; the lease and its renewal stay on the driver."""
        return {**self.__dict__, "staged": None}

    def write(self, blocks: Iterable, ctx: Any) -> int:
        from dataclasses import replace

        rows = (row for block in blocks for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True))
        spec = replace(self.spec, part=ctx.task_idx)
        spec.write(_example(dict(row)) for row in rows)
        return ctx.task_idx

    def on_write_complete(self, write_result: Any) -> None:
        parts = sorted(getattr(write_result, "write_returns", write_result))
        if parts != list(range(len(parts))):
            self.staged.discard()
            raise RuntimeError(f"write tasks reported parts {parts}, expected 0..{len(parts) - 1}")
        self.staged.commit(len(parts))

    def on_write_failed(self, error: Exception) -> None:
        if self.staged is not None:
            self.staged.discard()

    def get_name(self) -> str:
        return "Atlas"


def read_atlas(url: str, *, storage_options: dict | None = None, **settings: Any) -> "ray.data.Dataset":
    """An Atlas dataset as a Ray dataset: every example once, one row each."""
    return ray.data.read_datasource(AtlasDatasource(url, storage_options, **settings))


def write_atlas(dataset: "ray.data.Dataset", url: str, *, shard_size: int, block_size: int,
                compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
                storage_options: dict | None = None, overwrite: bool = False) -> None:
    """Write a Ray dataset as an Atlas dataset, committed once when every task has finished."""
    settings = ShardSettings(shard_size, block_size, compression_strategy)
    dictionary = None
    if settings.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        # trained on the driver, on the first shard's examples, as the writer trains it
        dictionary = _first_shard_dictionary((_example(dict(r)) for r in dataset.iter_rows()), settings)
    dataset.write_datasink(AtlasDatasink(url, settings, storage_options, overwrite, dictionary))
