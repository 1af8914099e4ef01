"""Parts written as Ray tasks (`convert(..., engine="ray")`): Ray's side of the write pipeline's engines, apart
from ray_data.py so that the pipeline, which ray_data.py builds on, never imports it back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

try:
    import ray
except ImportError as err:
    raise ImportError("Ray is not installed: pip install 'atlas_remote[ray]' (Ray 2.41 or newer)") from err


def _call(function: Callable[..., Any], *args: Any) -> Any:  # ray.remote takes functions, not bound methods
    return function(*args)


def run_tasks(write: Callable[..., tuple[int, int]], specs: list[tuple[Any, Any]]) -> Iterator[tuple[int, int]]:
    """Each (part spec, input) written by a Ray task of one CPU; what each returns, as they end.

    Uses the running Ray session, or starts one as `ray.init()` does (RAY_ADDRESS's cluster, else local).
    If one task fails the others are cancelled and the error is raised; finished parts stay staged for resume.
    """
    if not ray.is_initialized():
        ray.init()
    task = ray.remote(num_cpus=1)(_call)
    pending = [task.remote(write, spec, unit) for spec, unit in specs]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            result: tuple[int, int] = ray.get(done[0])
            yield result
    finally:
        for ref in pending:
            ray.cancel(ref)
