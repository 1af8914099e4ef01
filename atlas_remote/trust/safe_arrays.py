"""numpy and torch as a block gets them (see `unpickler`): dtypes of plain kinds only (numbers, booleans,
strings, dates, raw bytes, and records or subarrays of those, rebuilt from their fields and compared: a dtype's
pickled state can claim a field holds no objects and so forge pointers), arrays filled from the block's own bytes
and checked again once loaded; a torch storage loaded by torch's own `weights_only` loader once its declared size
fits its bytes, and a tensor charged what it spans, never reaching past its storage (`set_` would resize it)."""

from __future__ import annotations

import functools
import io
import math
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import walk_graph as wg
from .safe_builtins import LoadState, _Frozen, _frozen, _int_arg, _load, _sized
from .walk_graph import Refused

NUMPY_KINDS = "biufcmMSUV"  # bool, int, uint, float, complex, datetime, timedelta, bytes, str, void (raw/records)


# -- numpy ----------------------------------------------------------------------------------------------------------


class _Ndarray(_Frozen):
    """What `numpy.ndarray` stands for in a block: the type argument of `_reconstruct`, never called."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<the safe unpickler's numpy.ndarray>"


NDARRAY = _Ndarray()


@functools.lru_cache(maxsize=256)
def _itemsize(code: str) -> int:
    return np.dtype(code).itemsize


def _plain_dtype(dtype: Any, depth: int = 0) -> bool:
    """Numbers, booleans, strings, dates, raw bytes, and records or subarrays of those, nothing that holds objects.

    A record's layout is rebuilt from its fields and must equal it: a dtype's pickled state can claim fields and
    flags that numpy's own constructor would never make (an object field flagged as none is a forged pointer)."""
    if not isinstance(dtype, np.dtype) or depth > 8 or dtype.kind not in NUMPY_KINDS or dtype.hasobject:
        return False
    if dtype.fields is None and dtype.subdtype is None:  # the common case: one number, string or date
        return dtype.itemsize == _itemsize(dtype.str)
    if dtype.fields is not None:
        fields = [dtype.fields[name] for name in dtype.names or ()]
        if dtype.type is not np.void or len(fields) > 4096 or any(len(field) != 2 for field in fields):
            return False
        if not all(_plain_dtype(field[0], depth + 1) for field in fields):
            return False
        try:
            rebuilt = np.dtype(
                {
                    "names": list(dtype.names or ()),
                    "formats": [field[0] for field in fields],
                    "offsets": [field[1] for field in fields],
                    "itemsize": dtype.itemsize,
                }
            )
        except (TypeError, ValueError):
            return False
        return not rebuilt.hasobject and rebuilt == dtype and rebuilt.itemsize == dtype.itemsize
    base, shape = dtype.subdtype  # type: ignore[misc]
    return (
        _plain_dtype(base, depth + 1)
        and base.itemsize > 0  # else a subarray of 10^18 empty items, from 0 bytes
        and all(type(n) is int and n >= 0 for n in shape)
        and dtype.itemsize == base.itemsize * math.prod(shape)
    )


def _check_dtype(dtype: Any, what: str) -> Any:
    if not _plain_dtype(dtype):
        raise Refused(
            f"{what}: numpy dtype {dtype!r} is not plain data (numbers, booleans, strings, dates, bytes and "
            f"records of those); object dtypes need trusted=True"
        )
    return dtype


def _dtype(obj: Any, align: Any = False, copy: Any = False) -> Any:
    if type(obj) not in (str, bytes) or len(obj) > 32:
        raise Refused("numpy.dtype() takes the name of a plain type, like 'f4' or '<U8'")
    dtype = _check_dtype(np.dtype(obj), "numpy.dtype()")
    made = np.dtype(dtype, copy=True)  # never numpy's own (shared) instance: the pickle's state may set this one
    _load().dtypes.append(made)
    return made


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """numpy pickles an array as an empty one, then fills it from its state (raw bytes of the block)."""
    if (
        subtype is not NDARRAY
        or type(dtype) is not bytes
        or type(shape) is not tuple
        or (shape != (0,) and (0 not in shape or any(type(n) is not int for n in shape)))
    ):
        raise Refused("numpy's _reconstruct makes empty arrays only; their data comes from the block")
    array = np.ndarray.__new__(np.ndarray, shape, dtype)  # type: ignore[arg-type]  # a type code
    _load().arrays.append(array)
    return array


def _scalar(dtype: Any, data: Any = None) -> Any:
    _check_dtype(dtype, "numpy scalar")
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise Refused("a numpy scalar is made from exactly its dtype's bytes")
    return np.frombuffer(data, dtype=dtype)[0].copy()


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> Any:
    _check_dtype(dtype, "numpy array")
    data = _sized(buffer, (bytes, bytearray, pickle.PickleBuffer), "numpy array")
    if type(shape) is not tuple or any(type(n) is not int or n < 0 for n in shape) or order not in ("C", "F"):
        raise Refused("a numpy array's shape is a tuple of sizes")
    array = np.frombuffer(data, dtype=dtype)
    if array.size != math.prod(shape):
        raise Refused("a numpy array's shape does not match its bytes")
    array = array.reshape(shape, order=order).copy(order="K")
    _load().arrays.append(array)
    return array


def check_numpy(state: LoadState, size: int) -> None:
    """The dtypes and arrays a block made, once its BUILDs have set them: plain data, and no more elements than
    the block has bytes (an element takes one at least, but in a forged empty dtype)."""
    checked = set()
    for dtype in state.dtypes:
        _check_dtype(dtype, "numpy dtype")
        checked.add(id(dtype))
    for array in state.arrays:
        if id(array.dtype) not in checked:
            _check_dtype(array.dtype, "numpy array")
        if array.size > size:
            raise Refused(f"a numpy array of {array.size:,} elements from {size:,} bytes: not data")


# -- torch ----------------------------------------------------------------------------------------------------------


def _load_from_bytes(data: Any) -> Any:
    """A tensor's storage, as torch pickles it (torch.save's format, in bytes): loaded by torch's own
    weights_only loader, once the size it declares is known to fit in the bytes that carry it."""
    import torch

    data = _sized(data, (bytes,), "a torch storage")
    _load().budget.charge(len(data), "a torch storage")
    if _declared_storage_bytes(data) > len(data):
        raise Refused("a torch storage declares more bytes than it carries")
    return torch.load(io.BytesIO(data), weights_only=True)


def _declared_storage_bytes(data: bytes) -> int:
    """The bytes the storages of a torch.save stream declare (legacy format: pickled headers, then raw data)."""
    import torch

    declared = 0

    class Headers(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module == "torch" and name.endswith("Storage"):
                return getattr(torch, name)
            raise Refused(f"a torch storage names {module}.{name}")

        def persistent_load(self, pid: Any) -> Any:
            nonlocal declared
            if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage" or type(pid[4]) is not int:
                raise Refused("a torch storage with an unexpected header")
            with warnings.catch_warnings():  # torch's legacy storage classes warn on any use
                warnings.simplefilter("ignore")
                dtype = getattr(pid[1], "dtype", torch.uint8)
            declared += pid[4] * (dtype.itemsize if isinstance(dtype, torch.dtype) else 8)
            return None

    stream = io.BytesIO(data)
    if data[:2] == b"PK":  # the zip format: members are read as stored, and checked by torch
        import zipfile

        with zipfile.ZipFile(stream) as archive:
            for member in archive.infolist():
                if member.compress_type != zipfile.ZIP_STORED:
                    raise Refused("a torch storage with compressed members")
        return 0
    for _ in range(3):  # magic number, protocol version, system info
        Headers(stream).load()
    Headers(stream).load()
    return declared


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, metadata: Any = None
) -> Any:
    """A tensor over a storage of the block: charged the elements it spans (a stride of 0 makes a view of 10^10
    elements from one), and never reaching past its storage (torch's `set_` resizes a storage to what it is asked
    to span: a 404-byte block allocated 400 MB)."""
    import torch
    from torch._utils import _rebuild_tensor_v2

    if not isinstance(storage, torch.TypedStorage) or hooks or metadata:
        raise Refused("a tensor is rebuilt from a storage, with no backward hooks or metadata")
    offset = _int_arg(offset, "a tensor")
    size, stride = _sized(size, (tuple,), "a tensor's size"), _sized(stride, (tuple,), "a tensor's stride")
    if len(size) != len(stride) or any(type(n) is not int or n < 0 for n in (offset, *size, *stride)):
        raise Refused("a tensor's offset, sizes and strides are as many non-negative ints")
    itemsize, elements = storage.dtype.itemsize, math.prod(size)
    spans = 0 if not elements else offset + 1 + sum((n - 1) * step for n, step in zip(size, stride))
    if spans * itemsize > storage._untyped_storage.nbytes():
        raise Refused("a tensor reaches past its storage (torch would resize the storage to fit it)")
    _load().budget.charge(elements * itemsize, f"a tensor of {elements:,} elements")
    return _frozen_tensor(_rebuild_tensor_v2(storage, offset, size, stride, bool(requires_grad), hooks))


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any) -> Any:
    import torch
    from torch._utils import _rebuild_parameter

    if not isinstance(data, torch.Tensor) or hooks:
        raise Refused("a parameter is rebuilt from a tensor, with no backward hooks")
    return _frozen_tensor(_rebuild_parameter(data, bool(requires_grad), hooks))


def _refuse_tensor_state(state: Any) -> None:
    raise Refused("a block may not set the state of a tensor (BUILD): torch's set_ can resize its storage")


def _frozen_tensor(tensor: Any) -> Any:
    """BUILD on a tensor calls `Tensor.__setstate__`, which can `set_` it to any storage, size and stride: while
    the block loads, the tensor's own `__setstate__` refuses (an instance attribute, removed once loaded)."""
    tensor.__dict__["__setstate__"] = _refuse_tensor_state
    _load().tensors.append(tensor)
    return tensor


def _torch_size(dims: Any = ()) -> Any:
    import torch

    return torch.Size(tuple(_int_arg(n, "torch.Size()") for n in _sized(dims, (tuple, list), "torch.Size()")))


_NUMPY: dict[str, tuple[Callable[..., Any], int]] = {
    "_reconstruct": (_reconstruct, wg.M_ARRAY),
    "scalar": (_scalar, wg.M_OBJ),
}
ARRAYS: dict[tuple[str, str], tuple[Any, int]] = {  # a global: what a block gets, what the walk says it makes
    ("numpy", "ndarray"): (NDARRAY, wg.M_NOTHING),
    ("numpy", "dtype"): (_frozen(_dtype), wg.M_DTYPE),
    **{
        (f"numpy.{core}.multiarray", name): (_frozen(fn), makes)
        for core in ("core", "_core")
        for name, (fn, makes) in _NUMPY.items()
    },
    **{(f"numpy.{core}.numeric", "_frombuffer"): (_frozen(_frombuffer), wg.M_ARRAY) for core in ("core", "_core")},
    ("torch._utils", "_rebuild_tensor_v2"): (_frozen(_rebuild_tensor), wg.M_TENSOR),
    ("torch._utils", "_rebuild_parameter"): (_frozen(_rebuild_parameter), wg.M_TENSOR),
    ("torch.storage", "_load_from_bytes"): (_frozen(_load_from_bytes), wg.M_STORAGE),
    ("torch", "Size"): (_frozen(_torch_size), wg.M_OBJ),
}
