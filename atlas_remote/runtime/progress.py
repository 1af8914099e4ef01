"""Progress bars for long work (convert, write, build, cp, verify, checksum, Parquet out), from the command line,
Python or a notebook: tqdm's auto mode (a widget in a notebook, a bar on a terminal), with a total and an ETA
where the input says its size, and nothing where no one is looking (stderr not a terminal, outside a notebook)
or when asked (`progress=False`, `--quiet`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# What the Python API takes as `progress=`: None (a bar where someone is looking), True (a bar, always), False
# (nothing), or a function told (examples, bytes) as work is done.
ProgressArgument = bool | Callable[[int, int], None] | None


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where stderr is no terminal, yet someone is looking)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def shows(progress: ProgressArgument) -> bool:
    """Whether `progress=` makes a bar here (a caller's own function is not a bar)."""
    return progress is True or (progress is None and (sys.stderr.isatty() or in_notebook()))


class Progress:
    """A tqdm bar counting examples (or inputs: `unit="inputs"`, when only their number is known ahead), with
    the example and byte rates beside it. `update(examples, nbytes)` (or calling the bar) may be called from
    several threads; `phase(text)` says what runs before anything is counted (a bar at "0.00 ex" for seconds
    looks stuck); `input_done()` counts a finished input."""

    def __init__(
        self, total: int, description: str, quiet: bool = False, *, always: bool = False, unit: str = "ex"
    ) -> None:
        """total 0: not known ahead (a rate, no ETA). Shown when `always`, or unless quiet where someone looks."""
        self._bar: Any = None
        self._bytes = self._examples = 0
        self._description, self._unit = description, unit
        self._started = time.monotonic()
        if always or (not quiet and shows(None)):
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total or None,
                desc=description,
                unit=f" {unit}",
                unit_scale=unit == "ex",
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def update(self, examples: int, nbytes: int) -> None:
        if self._bar is None:
            return
        self._bytes += nbytes
        self._examples += examples
        seconds = max(time.monotonic() - self._started, 1e-9)
        rates = [f"{self._bytes / seconds / 1e6:.1f} MB/s"] if self._bytes else []  # none yet: no "0.0 MB/s"
        if self._unit != "ex":
            rates.insert(0, f"{self._examples:,} ex")
        self._bar.set_postfix_str(", ".join(rates), refresh=False)
        if self._unit == "ex":
            self._bar.update(examples)
        elif examples or nbytes:
            self._bar.refresh()

    __call__ = update

    def input_done(self) -> None:
        if self._bar is not None and self._unit != "ex":
            self._bar.update(1)

    def phase(self, text: str | None) -> None:
        """Show what runs now beside the description (None: back to counting); rates start again after it."""
        if self._bar is None:
            return
        self._bar.set_description_str(f"{self._description} ({text})" if text else self._description)
        if text is None:
            self._started = time.monotonic()
            self._bytes = self._examples = 0
            self._bar.reset()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()


@contextmanager
def progress_bar(
    progress: ProgressArgument, total: int, description: str, unit: str = "ex"
) -> Iterator[Callable[[int, int], None]]:
    """What `progress=` asks for (see ProgressArgument), as a function told (examples, bytes): a Progress bar of
    `total`, or the caller's own function as it is."""
    if callable(progress):
        yield progress
        return
    with Progress(total, description, quiet=progress is False, always=progress is True, unit=unit) as bar:
        yield bar
