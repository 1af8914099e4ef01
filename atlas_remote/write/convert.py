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
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..format.spec import CompressionStrategy
from ..importers import importer
from ..runtime.progress import ProgressArgument, progress_bar, shows
from .functions import function_name, label, mapped, resolve_function, token_arrays
from .parts import PartSpec
from .pipeline import ENGINES, WriteJob, WriteReport, run_write, shared_dictionary
from .settings import WriteSettings

__all__ = ["ConvertReport", "convert", "resolve_function"]
log = logging.getLogger(__name__)
ConvertReport = WriteReport  # its name before write() and build() returned it too


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
    progress: ProgressArgument = None,
    map: Callable[[Any], Any] | str | None = None,
    allowed_classes: Iterable[type | str] = (),
    tokens: str | None = None,
    dtype: str | None = None,
) -> WriteReport:
    """Convert `src` (in format `from_`: webdataset, megatron, dolma, zarr, jsonl, parquet, arrow) into an Atlas
    dataset at dest.

    `source_options` go to the importer (for Dolma: `attributes=[...]`; for Parquet and Arrow: `columns=[...]`,
    `split="train"`). `map` runs in the workers on every example: it returns an example, a list of examples, or
    None to drop it; with workers > 1, a module-level function of an importable module or its "module:function"
    name (workers import it), else any function (one of your script's too). A failure names the input and the
    example, and nothing is committed. The first block of each input is read back as a reader with default
    settings (and `allowed_classes`) reads it: a value such a reader refuses fails the conversion at once.
    `engine="ray"` writes each input as a Ray task (the `ray` extra; the session of `ray.init`, or
    RAY_ADDRESS's cluster) instead of `workers` local processes. `progress`: a bar where someone is looking
    (None; its total is the rows of Parquet sources, else the inputs), always (True), never (False), or a function
    told (examples, bytes) as the work is done (if it has a `phase(text)` method, that is told what runs before
    the first example is written). `tokens="tokens"`: count each block's tokens under that key while writing
    and save them beside the dataset (`<dest>.tokens`, where a TokenStream finds them); with `dtype="uint16"`
    too, the key's lists of token ids (JSON lines, Parquet) become arrays of that type on the way in, each id
    checked to fit.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "ray":
        importlib.import_module(".ray_data", __package__)  # before any work: without Ray, it says which extra
    module = importer(from_)
    options = dict(source_options or {})
    units = module.inputs(src, src_options, **({"split": options["split"]} if "split" in options else {}))
    if dtype is not None and tokens is None:
        raise ValueError("dtype= converts the token ids under tokens=KEY: give tokens too")
    settings = WriteSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums, tokens
    )
    # map runs where the parts are written: by name in worker processes or Ray tasks, as it is in this process
    elsewhere = engine == "ray" or workers > 1 and len(units) > 1
    function = None if map is None else function_name(map) if elsewhere else map
    task = _Task(from_, src, src_options, options, function, tokens if dtype else None, dtype)
    if workers > len(units) and engine == "processes":
        inputs = f"{len(units)} input{'s' * (len(units) != 1)}"
        log.warning(
            "%s: %s (%s) for %d workers: converted by %d, one input each", src, inputs, from_, workers, len(units)
        )
    total, unit = progress_total(from_, units, src_options, progress)
    with progress_bar(progress, total, "convert", unit) as tell:
        dictionary, _ = shared_dictionary(settings, task.examples(units), tell)
        named = map if map is None or isinstance(map, str) else f"{map.__module__}:{label(map)}"
        record = {"from": from_, "inputs": units, "source_options": task.options, "map": named}
        record.update({"dtype": dtype} if dtype else {})
        job = WriteJob(units, task.write, record, str(src), from_, "atlas-remote convert")
        return run_write(
            job,
            dest,
            settings,
            dictionary=dictionary,
            storage_options=dest_options,
            overwrite=overwrite,
            resume=resume,
            workers=workers,
            engine=engine,
            progress=tell,
            allowed_classes=allowed_classes,
        )


def progress_total(
    from_: str, units: list[str], storage_options: dict[str, Any] | None, progress: ProgressArgument
) -> tuple[int, str]:
    """(total, unit) of a conversion's bar: Parquet's row count from the files' footers (read only when a bar is
    shown), else the number of inputs."""
    if from_ == "parquet" and shows(progress):
        from ..importers.parquet import row_count

        return row_count(units, storage_options), "ex"
    return len(units), "inputs"


@dataclass(frozen=True)
class _Task:
    """What a worker process needs to read one input unit (picklable)."""

    source_format: str
    src: Any
    storage_options: dict[str, Any] | None
    options: dict[str, Any]
    map: Callable[[Any], Any] | str | None = None  # "module:function" (resolved in the worker), or in this process
    tokens: str | None = None  # with dtype: the key whose token ids become arrays of dtype
    dtype: str | None = None

    def examples(self, units: Iterable[str]) -> Iterator[Any]:
        return (example for unit in units for example in self._unit(unit))

    def _unit(self, unit: str) -> Iterator[Any]:
        examples = self._read([unit])
        if self.map is not None:
            examples = mapped(examples, self.map, unit)
        if self.tokens is not None and self.dtype is not None:
            examples = token_arrays(examples, self.tokens, self.dtype, unit)
        return examples

    def _read(self, units: list[str]) -> Iterator[Any]:
        module = importer(self.source_format)
        if self.source_format == "dolma":
            return module.samples(self.src, self.storage_options, files=units, **self.options)
        return module.samples(units, self.storage_options, **self.options)

    def write(self, spec: PartSpec, unit: str, progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        """Write one input unit as one part (in a worker process); returns (examples, bytes stored)."""
        manifest = spec.write(self.examples([unit]), progress, source=unit)
        return manifest.examples, manifest.stored_bytes
