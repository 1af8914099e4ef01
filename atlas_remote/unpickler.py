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

import collections
import datetime
import decimal
import fractions
import functools
import io
import math
import pickle
import re
import threading
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import pickle_walk as pw
from .errors import UnsafePickleError
from .pickle_walk import AMPLIFICATION, MAX_BLOCK_MULTIPLE, Refused, limit_for

MAX_DIGITS = 4300  # Python's own bound on int(str), applied to Decimal and Fraction too
NUMPY_KINDS = "biufcmMSUV"  # bool, int, uint, float, complex, datetime, timedelta, bytes, str, void (raw/records)


class Budget:
    """What the wrappers of one block may allocate, in bytes: the block's limit less what its opcodes may build."""

    def __init__(self, limit: int, spent: int = 0) -> None:
        self.limit, self.spent = limit, spent

    def charge(self, nbytes: int, what: str) -> None:
        self.spent += nbytes
        if self.spent > self.limit:
            raise Refused(
                f"{what} would make this block build more than {self.limit:,} bytes ({AMPLIFICATION}x its "
                f"decompressed size, and at most {MAX_BLOCK_MULTIPLE}x max_block_bytes): not data a block holds"
            )


class _Load:
    """The state of one block's unpickling, which the wrappers see."""

    def __init__(self, budget: Budget, user: frozenset[tuple[str, str]]) -> None:
        self.budget, self.user = budget, user
        self.dtypes: list = []
        self.arrays: list = []
        self.tensors: list = []


_current = threading.local()


def _load() -> _Load:
    return _current.load


def _sized(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if type(value) not in kinds:
        raise Refused(f"{what} takes {' or '.join(k.__name__ for k in kinds)}, not {type(value).__name__}")
    return value


class _Frozen:
    """An allowed global as a block gets it. Every block gets the same object, so nothing may change it: it has
    no attributes to set, and BUILD (which calls `__setstate__`) is refused. Before, BUILD on `builtins.int`'s
    factory made `defaultdict(int)['x']` give 0.0 in every dataset read after."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise Refused(f"a block may not set the state of {self!r} (BUILD): every block shares it")

    def __setattr__(self, name: str, value: Any) -> None:
        raise Refused(f"a block may not change {self!r}: every block shares it")

    __delattr__ = __setattr__  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<the safe unpickler's {type(self).__name__}>"


def _frozen(function: Callable) -> Any:
    """`function` as a frozen global: an instance of a class of its own whose call is the function itself."""
    return type(function.__name__.lstrip("_"), (_Frozen,), {"__slots__": (), "__call__": staticmethod(function)})()


class _Factory(_Frozen):
    """A builtin type named by a block: called with no argument it gives the empty value (defaultdict's
    factories); set and frozenset also take a list or tuple (protocol 3 pickles sets so)."""

    __slots__ = ("real",)
    real: type

    def __init__(self, real: type) -> None:
        object.__setattr__(self, "real", real)

    def __call__(self, *args: Any) -> Any:
        if not args:
            return self.real()
        if self.real in (set, frozenset) and len(args) == 1:
            items = _sized(args[0], (list, tuple), f"{self.real.__name__}()")
            _load().budget.charge(64 * len(items), f"{self.real.__name__}() of {len(items):,} items")
            return self.real(items)
        raise Refused(f"{self.real.__name__}() with arguments is not how data is pickled")

    def __repr__(self) -> str:
        return f"<the safe unpickler's {self.real.__name__}>"


def _bytearray(source: Any = b"", encoding: Any = None) -> bytearray:
    if encoding is not None:  # protocol 2: bytearray('latin-1 text', 'latin-1')
        if type(source) is not str or encoding != "latin-1":
            raise Refused("bytearray() takes bytes, or latin-1 text with protocol 2")
        source = source.encode("latin-1")
    data = _sized(source, (bytes, bytearray), "bytearray()")
    _load().budget.charge(len(data), "bytearray()")
    return bytearray(data)


def _number(value: Any) -> Any:
    return _sized(value, (int, float), "complex()")


def _complex(real: Any = 0, imag: Any = 0) -> complex:
    return complex(_number(real), _number(imag))


def _int_arg(value: Any, what: str) -> int:
    if type(value) is not int or value.bit_length() > MAX_DIGITS * 4:
        raise Refused(f"{what} takes an int of at most {MAX_DIGITS} digits")
    return value


def _slice(*args: Any) -> slice:
    return slice(*(None if a is None else _int_arg(a, "slice()") for a in args))


def _range(*args: Any) -> range:
    """Charged 8 bytes an item: what taking its items costs (a list's slice assignment, numpy) is then paid for."""
    made = range(*(_int_arg(a, "range()") for a in args))
    try:
        items = len(made)
    except OverflowError:  # more than 2^63 items
        items = 1 << 63
    _load().budget.charge(8 * items, f"a range of {items:,} items")
    return made


def _decimal(value: Any = "0", context: Any = None) -> decimal.Decimal:
    if context is not None or type(value) not in (str, int) or len(str(value)) > MAX_DIGITS:
        raise Refused(f"Decimal() takes a number of at most {MAX_DIGITS} characters")
    return decimal.Decimal(value)


_RATIONAL = re.compile(r"\s*[-+]?\d+(/\d+)?\s*\Z")


def _fraction(numerator: Any = 0, denominator: Any = None) -> fractions.Fraction:
    if type(numerator) is str:  # only "n" or "n/d": an exponent makes Fraction compute 10**exponent
        if len(numerator) > 2 * MAX_DIGITS or not _RATIONAL.match(numerator) or denominator is not None:
            raise Refused(f"Fraction() takes integers, or 'n/d' text of at most {MAX_DIGITS} digits each")
        return fractions.Fraction(numerator)
    return fractions.Fraction(
        _int_arg(numerator, "Fraction()"), None if denominator is None else _int_arg(denominator, "Fraction()")
    )


def _pairs(items: Any, what: str) -> Any:
    items = _sized(items, (list, tuple, dict), what)
    _load().budget.charge(64 * len(items), f"{what} of {len(items):,} items")
    return items


def _ordered_dict(items: Any = ()) -> collections.OrderedDict:
    return collections.OrderedDict(_pairs(items, "OrderedDict()"))


def _counter(items: Any = ()) -> collections.Counter:
    return collections.Counter(_pairs(items, "Counter()"))


def _defaultdict(factory: Any = None, items: Any = ()) -> collections.defaultdict:
    if factory is not None and not isinstance(factory, _Factory):
        raise Refused("defaultdict() takes a builtin type or None as its factory")
    return collections.defaultdict(factory.real if factory else None, _pairs(items, "defaultdict()"))


def _deque(items: Any = (), maxlen: Any = None) -> collections.deque:
    items = _sized(items, (list, tuple), "deque()")
    _load().budget.charge(640 + 8 * len(items), "deque()")
    return collections.deque(items, None if maxlen is None else _int_arg(maxlen, "deque()"))


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """copyreg._reconstructor (protocols 0 and 1): an instance of an allowed class, made without calling it."""
    if not isinstance(cls, type) or (cls.__module__, cls.__qualname__) not in _load().user:
        raise Refused("copyreg._reconstructor may only make instances of classes in allowed_classes")
    import copyreg

    return copyreg._reconstructor(cls, object if base is object else base, state)  # type: ignore[attr-defined]


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


def _check_numpy(state: _Load, size: int) -> None:
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


# -- the table ------------------------------------------------------------------------------------------------------

_FACTORIES = (list, dict, tuple, set, frozenset, int, float, str, bool, bytes)
_DATED = ("date", "datetime", "time", "timedelta", "timezone")  # immutable C types; their hashes are randomized
_NUMPY: dict[str, tuple[Callable[..., Any], int]] = {
    "_reconstruct": (_reconstruct, pw.M_ARRAY),
    "scalar": (_scalar, pw.M_OBJ),
}
_ALLOWED: dict[tuple[str, str], tuple[Any, int]] = {  # a global: what a block gets, what the walk says it makes
    **{("builtins", t.__name__): (_Factory(t), makes) for t, makes in zip(_FACTORIES, range(pw.F_BYTES + 1))},
    ("builtins", "bytearray"): (_frozen(_bytearray), pw.M_BYTEARRAY),
    ("builtins", "complex"): (_frozen(_complex), pw.M_OBJ),
    ("builtins", "slice"): (_frozen(_slice), pw.M_OBJ),
    ("builtins", "range"): (_frozen(_range), pw.M_OBJ),
    ("collections", "OrderedDict"): (_frozen(_ordered_dict), pw.M_ODICT),
    ("collections", "defaultdict"): (_frozen(_defaultdict), pw.M_DDICT),
    ("collections", "deque"): (_frozen(_deque), pw.M_DEQUE),
    ("collections", "Counter"): (_frozen(_counter), pw.M_COUNTER),
    **{("datetime", n): (getattr(datetime, n), pw.C_DATED) for n in _DATED},
    ("decimal", "Decimal"): (_frozen(_decimal), pw.M_OBJ),
    ("fractions", "Fraction"): (_frozen(_fraction), pw.M_OBJ),
    ("uuid", "UUID"): (uuid.UUID, pw.C_OBJ),  # a class (NEWOBJ takes only classes); BUILD on it fails, see security.md
    ("copyreg", "_reconstructor"): (_frozen(_reconstructor), pw.M_USER),
    ("numpy", "ndarray"): (NDARRAY, pw.M_NOTHING),
    ("numpy", "dtype"): (_frozen(_dtype), pw.M_DTYPE),
    **{
        (f"numpy.{core}.multiarray", name): (_frozen(fn), makes)
        for core in ("core", "_core")
        for name, (fn, makes) in _NUMPY.items()
    },
    **{(f"numpy.{core}.numeric", "_frombuffer"): (_frozen(_frombuffer), pw.M_ARRAY) for core in ("core", "_core")},
    ("torch._utils", "_rebuild_tensor_v2"): (_frozen(_rebuild_tensor), pw.M_TENSOR),
    ("torch._utils", "_rebuild_parameter"): (_frozen(_rebuild_parameter), pw.M_TENSOR),
    ("torch.storage", "_load_from_bytes"): (_frozen(_load_from_bytes), pw.M_STORAGE),
    ("torch", "Size"): (_frozen(_torch_size), pw.M_OBJ),
}
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
    subclass per policy), so no Python code runs per block but the lookup of each global it names."""

    user: frozenset[tuple[str, str]] = frozenset()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.user:
            return super().find_class(module, name)
        found = SAFE_GLOBALS.get((module, name))
        if found is not None:
            return found
        raise _refused_global(module, name)

    @classmethod
    def makes(cls, module: str, name: str) -> int:
        """What the walk takes calling a global to make (`pickle_walk.M_...`); refused as find_class refuses."""
        if (module, name) in cls.user:
            return pw.C_USER
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
    limit = limit_for(len(data), max_block_bytes)
    spent = 0 if signed else pw.walk(data, limit, unpickler.makes)
    state = _Load(Budget(limit, spent), unpickler.user)
    previous = getattr(_current, "load", None)
    _current.load = state
    try:
        value = unpickler(io.BytesIO(data)).load()
    finally:
        _current.load = previous
        for tensor in state.tensors:
            tensor.__dict__.pop("__setstate__", None)
    if state.dtypes or state.arrays:
        _check_numpy(state, len(data))
    return value
