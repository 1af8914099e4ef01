"""The one write pipeline: the shared dictionary trained first, the parts staged (parts.StagedParts), written in
this process, in worker processes or as Ray tasks, committed once, and one report. `build`, `write` and `convert`
are this function with their own inputs; `AtlasDatasetWriter`, `copy` and Ray's datasink, whose parts come to
them rather than from a list, use its start and end (StagedParts) directly."""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain, islice
from types import FrameType
from typing import Any

from ..errors import UnguardedScriptError
from ..format.codec import pickle_block, train_dictionary
from ..format.spec import MIN_BLOCKS_FOR_DICTIONARY
from ..runtime.processes import die_with_parent, quiet_resource_tracker
from .parts import StagedParts
from .settings import WriteSettings

ENGINES = ("processes", "ray")
DICTIONARY_PHASE = "reading the first shard to train the shared dictionary"
Progress = Callable[[int, int], None]  # (examples, bytes) done since the last call
PartTask = Callable[..., tuple[int, int]]  # (spec, unit, progress=None) -> (examples, bytes stored); picklable


@dataclass
class WriteReport:
    """What a write did: `build`, `write` and `convert` return it (`copy` has its own, of files copied)."""

    src: str
    dest: str
    source_format: str
    inputs: int
    inputs_resumed: int
    examples: int
    shards: int
    compression_strategy: str
    verb: str = "converted"  # what was done: "converted", "built", "wrote"

    def __str__(self) -> str:
        resumed = f" ({self.inputs_resumed} already staged by an earlier run)" if self.inputs_resumed else ""
        return (
            f"{self.verb} {self.src} ({self.source_format}, {self.inputs} input{'s' * (self.inputs != 1)}{resumed}) -> "
            f"{self.dest}: "
            f"{self.examples:,} examples in {self.shards} shards, {self.compression_strategy}"
        )


@dataclass(frozen=True)
class WriteJob:
    """What is written: `units[n]` becomes part n, by `task(spec, units[n], progress)`; `record` identifies the
    run for resume; `src`, `kind` and `holder` name it in the report and in the URL's lease."""

    units: list[Any]
    task: PartTask
    record: dict[str, Any]
    src: str
    kind: str
    holder: str
    verb: str = "converted"


def run_write(
    job: WriteJob,
    url: str,
    settings: WriteSettings,
    *,
    dictionary: bytes | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    workers: int = 1,
    engine: str = "processes",
    progress: Progress | None = None,
    allowed_classes: Iterable[type | str] = (),
) -> WriteReport:
    """Stage, write every part, commit once, report. On a failure before the commit the URL is given back and the
    finished parts stay staged, for resume=True."""
    if workers > 1 and len(job.units) > 1 and engine == "processes":
        refuse_unguarded_script()
    parts = StagedParts(
        url,
        settings.with_dictionary(dictionary),
        storage_options,
        holder=job.holder,
        job=job.record,
        dictionary=dictionary,
        overwrite=overwrite,
        resume=resume,
    )
    try:
        resumed = write_parts(
            parts,
            job.units,
            job.task,
            workers=workers,
            engine=engine,
            resume=resume,
            progress=progress,
            allowed_classes=class_names(allowed_classes),
        )
    except BaseException:
        parts.release()  # the staged parts stay, for resume=True
        raise
    meta = parts.commit(len(job.units))
    return WriteReport(
        job.src,
        url,
        job.kind,
        len(job.units),
        resumed,
        sum(meta.shard_sizes),
        len(meta.shard_sizes),
        meta.compression_strategy.name,
        job.verb,
    )


def class_names(classes: Iterable[type | str]) -> tuple[str, ...]:
    """Classes as "module.Name" strings: what crosses to worker processes, and what readers are given."""
    return tuple(c if isinstance(c, str) else f"{c.__module__}.{c.__qualname__}" for c in classes)


def shared_dictionary(
    settings: WriteSettings, examples: Iterator[Any], progress: Any
) -> tuple[bytes | None, Iterator[Any]]:
    """The shared dictionary, trained first (the spec's rule: on the dataset's first shard), and the examples
    to write (those read for it given again); None and the examples as they are for other strategies."""
    if not settings.shared_dictionary:
        return None, examples
    announce(progress, DICTIONARY_PHASE)
    try:
        first = list(islice(examples, settings.shard_size))
        return first_shard_dictionary(first, settings), chain(first, examples)
    finally:
        announce(progress, None)


def first_shard_dictionary(examples: Iterable[Any], settings: WriteSettings) -> bytes | None:
    """The shared dictionary the writer would train: on the first shard's pickled blocks (None if < 7). A block
    that cannot be pickled is left out: the part holding it names the example when it is written."""
    first = list(islice(examples, settings.shard_size))
    blocks = []
    for start in range(0, len(first), settings.block_size):
        try:
            blocks.append(pickle_block(first[start : start + settings.block_size]))
        except Exception:
            continue
    if len(blocks) < MIN_BLOCKS_FOR_DICTIONARY:
        return None
    return train_dictionary(blocks, settings.compression_dict_size, settings.compression_level)


def announce(progress: Any, phase: str | None) -> None:
    """Tell a progress object that has a `phase(text)` method what runs now (None: the writing itself)."""
    tell = getattr(progress, "phase", None)
    if tell is not None:
        tell(phase)


def write_parts(
    parts: StagedParts,
    units: list[Any],
    task: PartTask,
    workers: int = 1,
    engine: str = "processes",
    resume: bool = False,
    progress: Progress | None = None,
    allowed_classes: tuple[str, ...] = (),
) -> int:
    """Write part n from units[n] with `task`, for every part not staged yet (with resume, those an earlier run
    staged are skipped), in this process (progress example by example), in `workers` processes, or as Ray
    tasks; returns how many parts were already staged. Nothing is committed here."""
    done = parts.done() if resume else set()
    specs = [(parts.spec(n, allowed_classes), units[n]) for n in range(len(units)) if n not in done]
    if engine == "ray":
        from .ray_tasks import run_tasks

        for counts in run_tasks(task, specs):
            _report(progress, counts, finished=True)
    elif workers <= 1 or len(specs) <= 1:

        def examples_done(n: int) -> None:
            _report(progress, (n, 0))

        for spec, unit in specs:
            _, stored = task(spec, unit, examples_done)
            _report(progress, (0, stored), finished=True)
    else:
        quiet_resource_tracker()
        context = multiprocessing.get_context("spawn")  # no inherited threads, locks or filesystems
        with ProcessPoolExecutor(
            min(workers, len(specs)), mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
        ) as pool:
            for counts in pool.map(task, *zip(*specs)):
                _report(progress, counts, finished=True)
    return len(done)


def _report(progress: Progress | None, counts: tuple[int, int], finished: bool = False) -> None:
    """Tell progress of (examples, bytes) done; `finished`: a part is done (a progress bar counting inputs has
    an `input_done()`)."""
    if progress:
        progress(*counts)
        input_done = getattr(progress, "input_done", None)
        if finished and input_done is not None:
            input_done()


WORKER_BYTES = 64 << 20  # Arrow bytes of rows a worker process must have to pay for its start (docs/benchmarks.md)


def workers_for(input_bytes: int, workers: int | None) -> int:
    """How many processes write an input of `input_bytes`: at most `workers` (None: one per CPU), and no more than
    it has WORKER_BYTES for, since a spawned worker costs about a second to start (so 2 are never slower than 1)."""
    most = workers if workers is not None else os.cpu_count() or 1
    return max(1, min(most, input_bytes // WORKER_BYTES))


GUARD = 'if __name__ == "__main__":'


def refuse_unguarded_script() -> None:
    """UnguardedScriptError before any worker starts if the script running this write calls it outside
    `if __name__ == "__main__":`: every spawned worker imports the script again, and would run the write again.
    Also raised in a worker that is importing such a script (a call this check could not see)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UnguardedScriptError(
            f"a worker process re-ran the script that writes with workers > 1: put the call under `{GUARD}`"
        )
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not os.path.exists(path):
        return  # an interactive session, `python -c`, a notebook: workers do not import it again
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"
    ):
        frame = frame.f_back
    if frame is None:
        return
    if not _guarded(path, frame.f_lineno):
        raise UnguardedScriptError(
            f"{path}, line {frame.f_lineno}: writing with workers > 1 starts processes that import this script "
            f"again, which would run this write again; put it under `{GUARD}` (or use workers=1)"
        )


def _guarded(path: str, line: int) -> bool:
    """Whether line `line` of the script lies under an `if __name__ == "__main__":` block."""
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError, SystemError):  # SystemError: another thread's AST (cpython#106905)
        return True  # cannot tell: let the worker's own check speak
    return any(
        isinstance(node, ast.If)
        and _is_main_test(node.test)
        and node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)
        for node in ast.walk(tree)
    )


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    sides = [test.left, test.comparators[0]]
    names = {side.id for side in sides if isinstance(side, ast.Name)}
    values = {side.value for side in sides if isinstance(side, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}
