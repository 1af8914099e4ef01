"""No process of ours outlives the process that started it, however that one dies (SIGKILL included: nothing of
its own runs then).

Why each piece:
- DataLoader workers started from a fork server are the server's children, not the training process's: torch's
  watchdog in each worker asks whether its parent (the server) lives, and the server lives while any process
  holds its "alive" pipe, which every worker it forked holds. A SIGKILLed training process so left the server,
  its workers and multiprocessing's resource tracker (which lives while any of them holds its pipe) adopted by
  init, holding the job's stdout: `python train.py | tee log` never ended. So each worker ends when the training
  process ends (`end_with_starter`, from the moment it unpickles its stream), and so does the server (`fork_server_ends_with_parent`, run by its preload), and
  with them gone the tracker reads the end of its pipe and exits.
- `end_with` waits on a pidfd (Linux 5.3+): woken the moment the process ends, whichever process it is (a
  worker's grandparent), with no polling; elsewhere it polls. Linux's parent-death signal (`die_with_parent`)
  covers the moments before any thread of ours runs, for direct children.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

POLL_SECONDS = 0.2
_watched: set[int] = set()  # processes this one already ends with (its threads wait on them)
_lock = threading.Lock()


def _forget_watches() -> None:
    """A forked child has none of its parent's threads: nothing is watched there yet (and the lock is free)."""
    global _lock
    _watched.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_watches)


def end_with(pid: int) -> None:
    """End this process at once (`os._exit(1)`) when process `pid` ends; idempotent. A daemon thread waits."""
    with _lock:
        if pid in _watched or pid == os.getpid():
            return
        _watched.add(pid)
    threading.Thread(target=_wait_then_exit, args=(pid,), daemon=True, name="atlas-end-with").start()


def end_with_starter(owner: int) -> None:
    """If multiprocessing started this process from process `owner` (a DataLoader worker, forked from it or from
    its fork server), end with `owner`. Anywhere else (the owner itself, a process that unpickled a stream
    another way), nothing."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == owner:
        end_with(owner)


def _wait_then_exit(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here (not Linux, an old kernel): poll
        while _alive(pid):
            time.sleep(POLL_SECONDS)
        os._exit(1)
    select.select([handle], [], [])
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the number: ours is gone
        return False
    return True


def die_with_parent(parent: int) -> None:
    """A child process's first act: Linux's parent-death signal ends it the moment its parent dies (nothing to
    wait for), and `end_with` covers other systems and a parent that died before this ran."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # already gone (adopted by init or a subreaper)
        os._exit(1)
    end_with(parent)


def in_fork_server() -> bool:
    """Whether this code runs in multiprocessing's fork server, importing its preload list (the only code of
    ours the server runs: its loop is CPython's)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def fork_server_ends_with_parent() -> None:
    """In the fork server: end when the process that started it ends. Its workers' watchdogs then see their
    parent gone (and ours end them at once)."""
    if in_fork_server():
        end_with(os.getppid())


TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker without its warning of "leaked semaphore objects": after a
    SIGKILL of this process (nothing of ours runs then) it removes the semaphores itself, which is all that is
    needed, and the warning only alarms. It takes its warning filters from our `-W` options when it starts, so
    one is added for that moment."""
    from multiprocessing import resource_tracker

    if TRACKER_WARNING in sys.warnoptions:
        resource_tracker.ensure_running()
        return
    sys.warnoptions.append(TRACKER_WARNING)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(TRACKER_WARNING)


fork_server_ends_with_parent()  # see the module: this module is in the fork server's preload list
