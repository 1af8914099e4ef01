"""Converting a source format into an Atlas dataset: parallel, resumable, committed once.

Each input unit of the source (a tar file, a Megatron prefix, a Dolma documents file, a zarr store, a JSON-lines
file) becomes one part of a staged dataset (parts.StagedParts), written by a pool of processes; the parts are
committed together, their shards numbered in input order, so the dataset is the same whatever the number of
workers. A conversion that crashes or is killed keeps its staged parts: `resume=True` skips the inputs whose
part is complete and gives the same dataset as an uninterrupted run.

With SHARED_DICTIONARY_COMPRESSION the dictionary is trained first, as the spec says, on the dataset's first
shard: the first `shard_size` examples in input order (read once more for that), so every part compresses with
it. Fewer than 7 blocks there makes the whole dataset fall back to STANDARD_COMPRESSION, as the writer does.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from .errors import FormatError
from .format import CompressionStrategy
from .importers import importer
from .parts import PartSpec, StagedParts, first_shard_dictionary
from .writer import ShardSettings

Progress = Callable[[int, int], None]  # (examples, bytes) done since the last call
ENGINES = ("processes", "ray")


@dataclass
class ConvertReport:
    src: str
    dest: str
    source_format: str
    inputs: int
    inputs_resumed: int
    examples: int
    shards: int
    compression_strategy: str

    def __str__(self) -> str:
        resumed = f" ({self.inputs_resumed} already staged by an earlier run)" if self.inputs_resumed else ""
        return (
            f"converted {self.src} ({self.source_format}, {self.inputs} input{'s' * (self.inputs != 1)}{resumed}) -> "
            f"{self.dest}: "
            f"{self.examples:,} examples in {self.shards} shards, {self.compression_strategy}"
        )


def convert(
    src: str | list[str],
    dest: str,
    from_: str,
    *,
    shard_size: int = 10_000,
    block_size: int = 64,
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
    compression_level: int = 3,
    compression_dict_size: float = 0.01,
    checksums: bool = True,
    workers: int = 1,
    engine: str = "processes",
    overwrite: bool = False,
    resume: bool = False,
    src_options: dict[str, Any] | None = None,
    dest_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    map: Callable[[Any], Any] | str | None = None,
) -> ConvertReport:
    """Convert `src` (in format `from_`: webdataset, megatron, dolma, zarr, jsonl, parquet, arrow) into an Atlas
    dataset at dest.

    `source_options` go to the importer (for Dolma: `attributes=[...]`; for Parquet and Arrow: `columns=[...]`,
    `split="train"`). `map` runs in the workers on every example: it returns an example, a list of examples, or
    None to drop it; a module-level function, or its "module:function" name. A failure names the input and the
    example, and nothing is committed. `engine="ray"` writes each input as a
    Ray task (the `ray` extra; the session of `ray.init`, or RAY_ADDRESS's cluster) instead of `workers`
    local processes.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "ray":
        from .ray_data import write_parts  # before any work: without Ray, the error says which extra to install
    module = importer(from_)
    options = dict(source_options or {})
    units = module.inputs(src, src_options, **({"split": options["split"]} if "split" in options else {}))
    settings = ShardSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums
    )
    task = _Task(from_, src, src_options, options, map if map is None or isinstance(map, str) else _named(map))
    dictionary = None
    if settings.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        dictionary = first_shard_dictionary(task.examples(units), settings)
    job = {"from": from_, "inputs": units, "source_options": task.options, "map": task.map}
    parts = StagedParts(
        dest, settings, dest_options, job=job, dictionary=dictionary, overwrite=overwrite, resume=resume
    )
    try:
        done = parts.done() if resume else set()
        todo = [n for n in range(len(units)) if n not in done]
        specs = [(parts.spec(n), units[n]) for n in todo]
        if engine == "ray":
            for counts in write_parts(task.write, specs):
                _report(progress, counts)
        elif workers <= 1 or len(specs) <= 1:
            for spec, unit in specs:  # in this process: progress example by example
                manifest = spec.write(task.examples([unit]), progress and (lambda n: progress(n, 0)))
                _report(progress, (0, manifest.stored_bytes))
        else:
            context = multiprocessing.get_context("spawn")  # no inherited threads, locks or filesystems
            with ProcessPoolExecutor(
                min(workers, len(specs)), mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
            ) as pool:
                for counts in pool.map(task.write, *zip(*specs)):
                    _report(progress, counts)
    except BaseException:
        parts.release()  # the staged parts stay, for resume=True
        raise
    meta = parts.commit(len(units))
    return ConvertReport(
        str(src),
        dest,
        from_,
        len(units),
        len(done),
        sum(meta.shard_sizes),
        len(meta.shard_sizes),
        meta.compression_strategy.name,
    )


def die_with_parent(parent: int) -> None:
    """Worker initializer: a worker outlives a parent killed by SIGKILL (nothing runs to stop it), and would go on
    uploading into a staging folder that `recover` is about to delete. Linux's parent-death signal ends it at
    once; a watcher of the parent's pid covers the rest (other systems, a parent that died before this ran)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="atlas-parent-watch").start()


def _named(fn: Callable[[Any], Any]) -> str:
    """A function as the "module:function" a worker process imports (a lambda or a local function has none)."""
    name = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if "<" in name or name.startswith(":") or name.startswith("__main__:"):
        raise ValueError(
            f"map={fn!r} must be a function defined at the top level of an importable module (workers import it "
            f"by name), or its 'module:function' name"
        )
    return name


def resolve_function(name: str) -> Callable[[Any], Any]:
    module, _, attribute = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"map function {name!r} cannot be imported ({err}); give it as module:function") from err
    return target


def _mapped(examples: Iterator[Any], fn: Callable[[Any], Any], name: str, unit: str) -> Iterator[Any]:
    """fn over examples: an example, a list of examples, or None (dropped) for each."""
    for number, example in enumerate(examples):
        try:
            out = fn(example)
        except Exception as err:
            raise FormatError(
                f"the map function {name} failed on example {number} of this input ({type(err).__name__}: {err}); "
                f"nothing was committed",
                url=unit,
            ) from err
        if isinstance(out, list):
            yield from out
        elif out is not None:
            yield out


def _report(progress: Progress | None, counts: tuple[int, int]) -> None:
    if progress:
        progress(*counts)


@dataclass(frozen=True)
class _Task:
    """What a worker process needs to read one input unit (picklable)."""

    source_format: str
    src: Any
    storage_options: dict[str, Any] | None
    options: dict[str, Any]
    map: str | None = None  # "module:function", resolved in the worker

    def examples(self, units: Iterable[str]) -> Iterator[Any]:
        units = list(units)
        if self.map is None:
            return self._read(units)
        fn = resolve_function(self.map)
        return (mapped for unit in units for mapped in _mapped(self._read([unit]), fn, self.map, unit))

    def _read(self, units: list[str]) -> Iterator[Any]:
        module = importer(self.source_format)
        if self.source_format == "dolma":
            return module.samples(self.src, self.storage_options, files=units, **self.options)
        return module.samples(units, self.storage_options, **self.options)

    def write(self, spec: PartSpec, unit: str) -> tuple[int, int]:
        """Write one input unit as one part (in a worker process); returns (examples, bytes stored)."""
        manifest = spec.write(self.examples([unit]))
        return manifest.examples, manifest.stored_bytes


def write(
    examples: Iterable[Any],
    url: str,
    *,
    shard_size: int = 10_000,
    block_size: int = 64,
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    map: Callable[[Any], Any] | None = None,
) -> int:
    """Write examples as a dataset at url, committed once; returns how many were written. `examples` is any
    iterable, a pyarrow Table (rows as dicts, record batch by record batch) or a Hugging Face `datasets.Dataset`
    or `IterableDataset` (its rows). `map` as in convert(), in this process."""
    from .writer import AtlasDatasetWriter

    rows = examples
    if hasattr(examples, "to_batches") and hasattr(examples, "schema"):  # a pyarrow Table
        rows = (row for batch in examples.to_batches() for row in batch.to_pylist())
    if map is not None:
        rows = _mapped(iter(rows), map, getattr(map, "__qualname__", repr(map)), url)
    count = 0
    with AtlasDatasetWriter(
        url, shard_size, block_size, compression_strategy, storage_options=storage_options, overwrite=overwrite
    ) as writer:
        for row in rows:
            writer.add_example(row)
            count += 1
    return count
