"""The restricted unpickler: a block from someone else's bucket may build data, never run code, forge a pointer,
make memory or CPU time out of nothing, or change what a later block gives.

A pickle runs whatever callables its globals name, with the arguments it supplies. So each global a block may
name is judged by what it can do with hostile arguments, and is handed over wrapped: a wrapper takes only the
arguments that data needs (a bytearray from bytes, never from a size; a set from a list, never from a range),
charges what it allocates to the block's budget, and refuses the rest. What a block gets for a global is frozen
(no attribute of it can be set, BUILD on it is refused): every block shares it. numpy arrays and dtypes are
allowed in their plain kinds only (numbers, booleans, strings, datetimes, and records of those, rebuilt and
compared, since a dtype's pickled state can claim a field holds no objects and so forge pointers), and are
checked again once the block is loaded. torch tensors load their storage with torch's own `weights_only`
loader, after its declared size is checked against the bytes that carry it, and a tensor is charged what it
spans and may not reach past its storage (`set_` would resize it).

A block not signed by the reader's key is walked before anything is loaded (`pickle_walk`): how deep and how
shared what its opcodes build is, what each key hashed costs, what they allocate. A signed block was written by
the reader's own writer from the reader's own objects: the walk is skipped, the globals and their wrappers are
the same. `docs/security.md` lists every global, why it is safe, the bounds' figures and what was tried against
them; `trusted=True` is plain pickle.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from ..errors import UnsafePickleError
from . import walk as pw
from . import walk_graph as wg
from .safe_arrays import ARRAYS, check_numpy
from .safe_builtins import BUILTINS, CURRENT, Budget, LoadState
from .walk_graph import limit_for

# -- the table ------------------------------------------------------------------------------------------------------

_ALLOWED: dict[tuple[str, str], tuple[Any, int]] = {**BUILTINS, **ARRAYS}  # a global: what a block gets, what it makes
SAFE_GLOBALS: dict[tuple[str, str], Any] = {name: given for name, (given, _) in _ALLOWED.items()}
WALK_MAKES: dict[tuple[str, str], int] = {name: makes for name, (_, makes) in _ALLOWED.items()}


def _refused_global(module: str, name: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"refused to unpickle global {module}.{name}: it is not data the safe unpickler "
        f"knows; allow the class if it is yours (allowed_classes=['{module}.{name}']), "
        f"or trust the dataset (trusted=True)"
    )


class RestrictedUnpickler(pickle.Unpickler):
    """A C unpickler whose globals come from SAFE_GLOBALS or the policy's allowed classes (`user`, set on a
    subclass per policy), so no Python code runs per block but the lookup of each global it names. The state the
    wrappers charge (`LoadState`) is made when the block names its first allowed global: a block of plain data
    (numbers, text, lists, dicts) has nothing to charge it."""

    user: frozenset[tuple[str, str]] = frozenset()
    state: LoadState | None = None
    plan: tuple[int, int, int] = (0, 0, 0)  # the block's decompressed bytes, max_block_bytes, what its walk charged
    previous: LoadState | None = None  # the state of a load this one runs within (an allowed class's own load)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.user:
            return super().find_class(module, name)
        found = SAFE_GLOBALS.get((module, name))
        if found is None:
            raise _refused_global(module, name)
        if self.state is None:
            size, max_block_bytes, spent = self.plan
            self.state = LoadState(Budget(limit_for(size, max_block_bytes), spent), self.user)
            self.previous = getattr(CURRENT, "load", None)
            CURRENT.load = self.state
        return found

    @classmethod
    def makes(cls, module: str, name: str) -> int:
        """What the walk takes calling a global to make (`pickle_walk.M_...`); refused as find_class refuses."""
        if (module, name) in cls.user:
            return wg.C_USER
        makes = WALK_MAKES.get((module, name))
        if makes is None:
            raise _refused_global(module, name)
        return makes


def walk(data: bytes, limit: int, user: frozenset[tuple[str, str]] = frozenset()) -> int:
    """The walk of an unsigned block (`pickle_walk.walk`) with the globals this module allows, and `user`'s:
    what its opcodes allocate, after refusing what would crash, stall or outlive the load."""
    unpickler: type[RestrictedUnpickler] = type("PolicyUnpickler", (RestrictedUnpickler,), {"user": user})
    return pw.walk(data, limit, unpickler.makes)


def load(
    unpickler: type[RestrictedUnpickler], data: bytes | memoryview, max_block_bytes: int, signed: bool = False
) -> Any:
    """What the block holds, refusing what breaks the policy. An unsigned block is walked before loading (what its
    opcodes build: depth, sharing, hashed keys, memory); a signed one (written by the reader's own writer) is not.
    On both, what allowed globals build is charged as they build it, and numpy dtypes are checked again once set."""
    data = data if type(data) is bytes else bytes(data)  # io.BytesIO would copy it all the same
    spent = 0 if signed else pw.walk(data, limit_for(len(data), max_block_bytes), unpickler.makes)
    loading = unpickler(io.BytesIO(data))
    loading.plan = (len(data), max_block_bytes, spent)
    try:
        value = loading.load()
    finally:
        state = loading.state
        if state is not None:
            CURRENT.load = loading.previous
            for tensor in state.tensors:
                tensor.__dict__.pop("__setstate__", None)
    if state is not None and (state.dtypes or state.arrays):
        check_numpy(state, len(data))
    return value
