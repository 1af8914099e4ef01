"""Progress bars for the command line: examples/s, MB/s and ETA on a terminal, nothing otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A tqdm bar counting examples, with the byte rate beside it. Silent unless stderr is a terminal, or
    when quiet. `update(examples, nbytes)` (or calling the bar) may be called from several threads; `phase(text)`
    says what runs before anything is counted (a bar at "0.00 ex" for seconds looks stuck)."""

    def __init__(self, total_examples: int, description: str, quiet: bool = False) -> None:
        """total_examples 0: not known ahead (a rate, no ETA)."""
        self._bar: Any = None
        self._bytes = 0
        self._description = description
        self._started = time.monotonic()
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_examples or None,
                desc=description,
                unit=" ex",
                unit_scale=True,
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def update(self, examples: int, nbytes: int) -> None:
        if self._bar is None:
            return
        self._bytes += nbytes
        seconds = max(time.monotonic() - self._started, 1e-9)
        self._bar.set_postfix_str(f"{self._bytes / seconds / 1e6:.1f} MB/s", refresh=False)
        self._bar.update(examples)

    __call__ = update

    def phase(self, text: str | None) -> None:
        """Show what runs now beside the description (None: back to counting); rates start again after it."""
        if self._bar is None:
            return
        self._bar.set_description_str(f"{self._description} ({text})" if text else self._description)
        if text is None:
            self._started = time.monotonic()
            self._bar.reset()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()
