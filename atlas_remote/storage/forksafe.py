"""Fork safety in one place: objects that hold locks, threads, clients or connections register here, and a
forked child resets them all before it runs any of our code (`os.register_at_fork`).

Why: a child made by fork() inherits its parent's memory but only the thread that forked. A lock another
thread held stays locked forever, a thread pool's workers are gone, an async client's event loop belongs to a
thread that does not exist, and SQLite connections must not cross. Each registered object's `after_fork()`
drops what it cannot keep; what survives a fork (decoded blocks, copy-on-write) stays.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Protocol


class ForkAware(Protocol):
    def after_fork(self) -> None: ...


_objects: weakref.WeakSet = weakref.WeakSet()
_hooks: list[Callable[[], None]] = []


def register(obj: ForkAware) -> None:
    """Call obj.after_fork() in every child forked while obj is alive (it is held weakly)."""
    _objects.add(obj)


def on_fork(hook: Callable[[], None]) -> None:
    """Call hook() in every forked child, before the registered objects (module-level state)."""
    _hooks.append(hook)


def _in_child() -> None:
    for hook in _hooks:
        hook()
    for obj in list(_objects):
        obj.after_fork()


os.register_at_fork(after_in_child=_in_child)
