"""Crash at a named step of a write, from the test side: the crash tests put this folder first on the PYTHONPATH
of the processes they start (and so of those processes' spawned workers, which inherit the environment), with
ATLAS_REMOTE_TEST_KILL_AT or ATLAS_REMOTE_TEST_STOP_AT naming a step (`commit.step_done(name)`, a no-op in the
product). Python imports `sitecustomize` at start-up: this one gives `step_done` a body that SIGKILLs the process
(to prove recovery) or SIGSTOPs it (to prove fencing) at that step. The body is swapped in place (its code
object), so every module that imported `step_done` by name gets it."""

import os

KILL_AT_VARIABLE = "ATLAS_REMOTE_TEST_KILL_AT"
STOP_AT_VARIABLE = "ATLAS_REMOTE_TEST_STOP_AT"


def _crash_at_step(name: str) -> None:
    import os
    import signal
    import time

    if os.environ.get("ATLAS_REMOTE_TEST_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("ATLAS_REMOTE_TEST_STOP_AT") == name:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.05)  # the signal is delivered before the next step


if os.environ.get(KILL_AT_VARIABLE) or os.environ.get(STOP_AT_VARIABLE):
    from atlas_remote.write import commit

    commit.step_done.__code__ = _crash_at_step.__code__
