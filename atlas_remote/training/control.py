"""The epoch and resume point shared with DataLoader workers that outlive an epoch (`persistent_workers`)."""

from __future__ import annotations

import ctypes
import json
import multiprocessing

from .epoch_state import EpochState

CONTROL_BYTES = 1 << 16  # room for a resume point shared with persistent workers (about 90 bytes a deal)


class Control:
    """The epoch and resume point, shared with DataLoader workers that outlive an epoch (`persistent_workers`):
    they were handed a copy of the stream once, so `set_epoch` and `load_state_dict` reach them through this
    block of shared memory instead, read at the start of every pass. A generation number says whether the
    parent published something since a worker's copy was made (a worker resumed by a StatefulDataLoader keeps
    its own resume point until then). No lock: the parent writes only between passes."""

    def __init__(self) -> None:
        self.block = multiprocessing.RawArray(ctypes.c_char, CONTROL_BYTES)

    def write(self, state: EpochState) -> int:
        data = json.dumps(state.to_dict()).encode()
        if len(data) + 16 > CONTROL_BYTES:
            raise ValueError(
                f"a resume point of {len(data):,} bytes does not fit the {CONTROL_BYTES:,} bytes "
                f"shared with persistent workers; use persistent_workers=False"
            )
        generation = int.from_bytes(self.block.raw[:8], "little") + 1
        self.block.raw = generation.to_bytes(8, "little") + len(data).to_bytes(8, "little") + data
        return generation

    def read(self) -> tuple[int, EpochState | None]:
        head = self.block.raw[:16]
        generation, size = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
        if not size:
            return generation, None
        return generation, EpochState.from_dict(json.loads(self.block.raw[16 : 16 + size]))
