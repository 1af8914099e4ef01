"""The epoch state's former module name, kept so that `from atlas_remote.checkpoint import ...` keeps working:
the state lives in epoch_state.py."""

from .epoch_state import *  # noqa: F403
