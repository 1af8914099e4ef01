"""Ray Data: an Atlas dataset read as a `ray.data.Dataset`, and written from one with a single commit.

Needs the `ray` extra (`pip install "atlas_remote[ray]"`, Ray 2.41 or newer: the first with the Datasink
`WriteResult`). The same code runs in a local Ray session and on a cluster (`ray.init(address=...)`).

Reading: the driver reads the root meta.json and every shard's meta.json (one concurrent round), and cuts the
shards into read tasks of whole blocks, len/parallelism rows each but within [MIN_ROWS_PER_TASK, MAX_ROWS_PER_TASK];
each task carries its row count. A task opens the dataset in its worker and reads its blocks with the
sequential path: neighbouring blocks merged into one ranged read, the next reads in flight. A dict example is
the row; any other example becomes {"item": example}, as in `ray.data.from_items`.

Writing: the Atlas commit model is Ray's Datasink lifecycle. `on_write_start` takes the URL's lease and a
staging folder (parts.StagedParts, the write pipeline's start) on the driver; each write task writes its rows as one staged part of whole
shards (PartSpec.write); `on_write_complete` commits once, on the driver: shards numbered in task order, root
meta.json last. `on_write_failed` (a task raised; a task whose node was lost Ray Data runs again) deletes the
staging and gives the URL back: nothing is committed and a dataset already at the URL is untouched.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from functools import partial
from typing import Any

try:
    import pyarrow
    import ray
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
except ImportError as err:
    raise ImportError("Ray Data is not installed: pip install 'atlas_remote[ray]' (Ray 2.41 or newer)") from err

from ..errors import CommitInterruptedError
from ..format.spec import AtlasDatasetMetadata, CompressionStrategy
from ..read.reader import open as open_dataset
from .parts import PartSpec, StagedParts
from .pipeline import first_shard_dictionary
from .settings import WriteSettings

# Rows per read task, whatever parallelism Ray asks for (it asks for 200 tasks of a dataset it cannot size):
# below MIN, opening the dataset and scheduling the task cost more than reading; MAX keeps a task's share small
# enough to spread over a cluster (docs/benchmarks.md, "Figures behind the code").
MIN_ROWS_PER_TASK, MAX_ROWS_PER_TASK = 10_000, 100_000
ROWS_PER_BLOCK = 4096  # rows per Ray block a read task yields


def _row(example: Any) -> dict:
    return example if isinstance(example, dict) else {"item": example}


def _example(row: Any) -> Any:
    row = dict(row)
    return row["item"] if row.keys() == {"item"} else row


PLAIN = frozenset({int, float, str, bytes, bool, type(None)})  # what Arrow holds as it is


def _block(rows: list[dict]):
    """A Ray block of rows. Rows that lack some of the block's columns get None there (Ray 2.60's builder does
    that, 2.41's refuses such rows). Rows of plain values become an Arrow table in one call; any other rows go
    through Ray's own builder, as `from_items` does (it keeps objects Arrow cannot hold), which is much slower."""
    columns = dict.fromkeys(key for row in rows for key in row)
    if any(len(row) != len(columns) for row in rows):
        rows = [{key: row.get(key) for key in columns} for row in rows]
    if all(type(v) in PLAIN for row in rows for v in row.values()):
        try:
            return pyarrow.Table.from_pylist(rows)
        except (pyarrow.ArrowException, OverflowError):  # a column of mixed types, an int beyond 64 bits
            pass
    from ray.data._internal.delegating_block_builder import DelegatingBlockBuilder

    builder = DelegatingBlockBuilder()
    for row in rows:
        builder.add(row)
    return builder.build()


def _metadata(rows: int) -> BlockMetadata:
    known: dict[str, Any] = {"num_rows": rows, "size_bytes": None, "input_files": None, "exec_stats": None}
    if "schema" in {f.name for f in fields(BlockMetadata)}:  # older Ray (2.41 has it, 2.60 not): unknown until read
        known["schema"] = None
    return BlockMetadata(**known)


def _read(url: str, storage_options: dict | None, settings: dict, start: int, stop: int) -> Iterator:
    """A read task's body, in its worker: examples [start, stop) as Ray blocks."""
    ds = open_dataset(url, storage_options=storage_options, **settings)
    rows: list[dict] = []
    for example in ds.iter(start, stop):
        rows.append(_row(example))
        if len(rows) == ROWS_PER_BLOCK:
            yield _block(rows)
            rows = []
    if rows:
        yield _block(rows)


class AtlasDatasource(Datasource):
    """Read tasks over runs of whole blocks; see the module docstring."""

    def __init__(self, url: str, storage_options: dict | None = None, **settings: Any) -> None:
        super().__init__()
        self.url, self.storage_options, self.settings = url, storage_options, settings
        self.dataset = open_dataset(url, storage_options=storage_options, **settings)  # a wrong URL fails here
        self.estimate: int | None = None

    def estimate_inmemory_data_size(self) -> int:
        """What Ray sizes its parallelism by: without it Ray asks for 200 tasks and splits the output of ours to
        match, which is slower. The first block's pickled size per example, times the examples: one shard opened
        and one block read, on the driver."""
        if self.estimate is None:
            ds = self.dataset
            position = next((p for p, shard in enumerate(ds.shards) if shard.size), None)
            if position is None:
                return 0
            shard = ds.shards[position]
            ds.open_shard(shard)
            first = ds.read(range(shard.start, shard.start + shard.examples_in_block(0)))
            self.estimate = len(pickle.dumps(first, protocol=pickle.HIGHEST_PROTOCOL)) * len(ds) // len(first)
        return self.estimate

    def task_ranges(self, parallelism: int) -> list[tuple[int, int]]:
        """(start, stop) of each read task: whole blocks of one shard, about len/parallelism rows each."""
        ds = self.dataset
        wanted = min(MAX_ROWS_PER_TASK, max(MIN_ROWS_PER_TASK, -(-len(ds) // max(parallelism, 1))))
        ranges = []
        for shard, meta in zip(ds.shards, ds.load_shard_metadata()):
            rows = max(1, wanted // meta.block_size) * meta.block_size
            ranges += [(shard.start + i, shard.start + min(i + rows, shard.size)) for i in range(0, shard.size, rows)]
        return ranges

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None, **_: Any
    ) -> list[ReadTask]:
        limit = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}  # Ray >= 2.50
        args = (self.url, self.storage_options, self.settings)
        return [
            ReadTask(partial(_read, *args, start, stop), _metadata(stop - start), **limit)
            for start, stop in self.task_ranges(parallelism)
        ]

    def get_name(self) -> str:
        return "Atlas"


def _examples_of(blocks: Iterable[Any]) -> Iterator[Any]:
    """A write task's blocks as examples."""
    for block in blocks:
        accessor: Any = BlockAccessor.for_block(block)  # Ray's stubs leave its rows' type open
        for row in accessor.iter_rows(public_row_format=True):
            yield _example(row)


def _write_returns(write_result: Any) -> list:
    """The tasks' return values: Ray >= 2.41 passes a WriteResult, older Ray passed the list itself."""
    return list(getattr(write_result, "write_returns", write_result))


class AtlasDatasink(Datasink):
    """Each write task stages one part; the driver commits them all at once; see the module docstring."""

    def __init__(
        self,
        url: str,
        settings: WriteSettings,
        storage_options: dict | None = None,
        overwrite: bool = False,
        dictionary: bytes | None = None,
    ) -> None:
        self.url, self.settings, self.storage_options = url, settings, storage_options
        self.overwrite, self.dictionary = overwrite, dictionary
        self.staged: StagedParts | None = None  # on the driver only
        self.spec: PartSpec | None = None  # what write tasks get
        self.metadata: AtlasDatasetMetadata | None = None  # the committed dataset's, after on_write_complete

    def __getstate__(self) -> dict:
        """Write tasks get the part spec; the lease and its renewal stay on the driver."""
        return {**self.__dict__, "staged": None}

    def on_write_start(self, schema: Any = None) -> None:
        self.staged = StagedParts(
            self.url,
            self.settings.with_dictionary(self.dictionary),
            self.storage_options,
            holder="ray write_atlas",
            dictionary=self.dictionary,
            overwrite=self.overwrite,
        )
        self.spec = self.staged.spec(0)

    def write(self, blocks: Iterable, ctx: Any) -> dict:
        if self.spec is None:
            raise RuntimeError(f"{self.url}: a write task ran before on_write_start")
        manifest = replace(self.spec, part=ctx.task_idx).write(_examples_of(blocks))
        return {"part": ctx.task_idx, "examples": manifest.examples, "bytes": manifest.stored_bytes}

    def on_write_complete(self, write_result: Any) -> None:
        parts = sorted(r["part"] for r in _write_returns(write_result))
        if parts != list(range(len(parts))):  # Ray calls on_write_failed next, which discards the staging
            raise RuntimeError(
                f"{self.url}: Ray's write tasks reported parts {parts}, expected 0..{len(parts) - 1}; "
                f"nothing was committed"
            )
        if self.staged is None:
            raise RuntimeError(f"{self.url}: on_write_complete without on_write_start; nothing was committed")
        self.metadata = self.staged.commit(len(parts))

    def on_write_failed(self, error: Exception) -> None:
        # A commit interrupted after its journal is finished by `recover`, which needs the staging: keep it.
        if self.staged is not None and not isinstance(error, CommitInterruptedError):
            self.staged.discard()

    def get_name(self) -> str:
        return "Atlas"


def read_atlas(url: str, *, storage_options: dict | None = None, **settings: Any) -> ray.data.Dataset:
    """An Atlas dataset as a Ray dataset: every example once, one row each (reader settings as for `open`)."""
    return ray.data.read_datasource(AtlasDatasource(url, storage_options, **settings))


def write_atlas(
    dataset: ray.data.Dataset,
    url: str,
    *,
    shard_size: int,
    block_size: int,
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
    storage_options: dict | None = None,
    overwrite: bool = False,
    ray_remote_args: dict | None = None,
) -> AtlasDatasetMetadata:
    """Write a Ray dataset as an Atlas dataset at url, committed once when every task has finished.

    Each write task writes whole shards of its own rows, so the last shard of each task may be short. With
    SHARED_DICTIONARY_COMPRESSION the dictionary is trained on the driver, before the tasks start, on the
    first `shard_size` rows the dataset yields (it is executed once more for them, up to that limit); fewer
    than 7 blocks there gives STANDARD_COMPRESSION, as the writer does. `ray_remote_args` go to the write
    tasks as Ray's own writers take them (`{"max_retries": 0}`: a task whose node dies fails the write,
    which then leaves nothing, instead of running again elsewhere).
    """
    settings = WriteSettings(shard_size, block_size, compression_strategy)
    dictionary = None
    if settings.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        dictionary = first_shard_dictionary((_example(row) for row in dataset.limit(shard_size).iter_rows()), settings)
    sink = AtlasDatasink(url, settings, storage_options, overwrite, dictionary)
    dataset.write_datasink(sink, ray_remote_args=ray_remote_args)
    if sink.metadata is None:  # Ray returned without calling on_write_complete
        raise RuntimeError(f"{url}: Ray's write ended without a commit; nothing was committed")
    return sink.metadata
