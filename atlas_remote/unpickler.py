"""The restricted unpickler: a block from someone else's bucket may build data, never run code, forge a pointer or
make memory out of nothing.

A pickle runs whatever callables its globals name, with the arguments it supplies. So each global a block may
name is judged by what it can do with hostile arguments, and most are handed over wrapped: a wrapper takes only
the arguments that data needs (a bytearray from bytes, never from a size; a set from a list, never from a
range), charges what it allocates to the block's budget, and refuses the rest. numpy arrays and dtypes are
allowed in their plain kinds only (numbers, booleans, strings, datetimes; never objects, records or void, whose
pickled state can claim a field holds no objects and so forge pointers), and are checked again once the block is
loaded. torch tensors load their storage with torch's own `weights_only` loader, after its declared size is
checked against the bytes that carry it.

What unpickling builds is bounded: the wrappers' charges and an estimate of the rest (the containers the block
created, counted by the garbage collector's allocation counter, at CONTAINER_BYTES each, plus one and a half
times the decompressed bytes) must stay within AMPLIFICATION times the decompressed size plus a floor. `docs/security.md`
lists every global, why it is safe, and what was tried against it; `trusted=True` is plain pickle.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import gc
import io
import math
import pickle
import re
import threading
import uuid
import warnings
from typing import Any

from .errors import UnsafePickleError

AMPLIFICATION = 128  # what a block may build, as a multiple of its decompressed bytes (above FLOOR_BYTES)
FLOOR_BYTES = 1 << 20
CONTAINER_BYTES = 128  # counted for each container (dict, list, set, tuple...) a block creates
MAX_DIGITS = 4300  # Python's own bound on int(str), applied to Decimal and Fraction too
NUMPY_KINDS = "biufcmMSUV"  # bool, int, uint, float, complex, datetime, timedelta, bytes, str, void (raw/records)


class Refused(UnsafePickleError):
    """A global called with arguments that data never needs (a size, an iterable, a structured dtype...)."""


class Budget:
    """What the wrappers of one block may allocate, in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def charge(self, nbytes: int, what: str) -> None:
        self.spent += nbytes
        if self.spent > self.limit:
            raise Refused(
                f"{what} would make this block build more than {self.limit:,} bytes "
                f"({AMPLIFICATION}x its decompressed size): not data a block holds"
            )


class _Load:
    """The state of one block's unpickling, which the wrappers see."""

    def __init__(self, budget: Budget, user: frozenset[tuple[str, str]]) -> None:
        self.budget, self.user = budget, user
        self.dtypes: list = []
        self.arrays: list = []


_current = threading.local()


def _load() -> _Load:
    return _current.load


def _sized(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if type(value) not in kinds:
        raise Refused(f"{what} takes {' or '.join(k.__name__ for k in kinds)}, not {type(value).__name__}")
    return value


class _Factory:
    """A builtin type named by a block: called with no argument it gives the empty value (defaultdict's
    factories); set and frozenset also take a list or tuple (protocol 3 pickles sets so)."""

    def __init__(self, real: type) -> None:
        self.real = real

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
    return range(*(_int_arg(a, "range()") for a in args))


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


class _NdarrayType:
    """What `numpy.ndarray` stands for in a block: the type argument of `_reconstruct`, never called."""

    def __repr__(self) -> str:
        return "<the safe unpickler's numpy.ndarray>"


NDARRAY = _NdarrayType()


def _plain_dtype(dtype: Any, depth: int = 0) -> bool:
    """Numbers, booleans, strings, dates, raw bytes, and records or subarrays of those, nothing that holds objects.

    A record's layout is rebuilt from its fields and must equal it: a dtype's pickled state can claim fields and
    flags that numpy's own constructor would never make (an object field flagged as none is a forged pointer)."""
    import numpy as np

    if not isinstance(dtype, np.dtype) or depth > 8 or dtype.kind not in NUMPY_KINDS or dtype.hasobject:
        return False
    if dtype.fields is not None:
        fields = [dtype.fields[name] for name in dtype.names or ()]
        if dtype.type is not np.void or len(fields) > 4096 or any(len(field) != 2 for field in fields):
            return False
        if not all(_plain_dtype(field[0], depth + 1) for field in fields):
            return False
        try:
            rebuilt = np.dtype(
                {  # type: ignore[call-overload]
                    "names": list(dtype.names or ()),
                    "formats": [field[0] for field in fields],
                    "offsets": [field[1] for field in fields],
                    "itemsize": dtype.itemsize,
                }
            )
        except (TypeError, ValueError):
            return False
        return not rebuilt.hasobject and rebuilt == dtype and rebuilt.itemsize == dtype.itemsize
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return (
            _plain_dtype(base, depth + 1)
            and all(type(n) is int and n >= 0 for n in shape)
            and dtype.itemsize == base.itemsize * math.prod(shape)
        )
    return dtype.itemsize == np.dtype(dtype.str).itemsize


def _check_dtype(dtype: Any, what: str) -> Any:
    if not _plain_dtype(dtype):
        raise Refused(
            f"{what}: numpy dtype {dtype!r} is not plain data (numbers, booleans, strings, dates, bytes and "
            f"records of those); object dtypes need trusted=True"
        )
    return dtype


def _dtype(obj: Any, align: Any = False, copy: Any = False) -> Any:
    import numpy as np

    if type(obj) not in (str, bytes) or len(obj) > 32:
        raise Refused("numpy.dtype() takes the name of a plain type, like 'f4' or '<U8'")
    dtype = _check_dtype(np.dtype(obj), "numpy.dtype()")
    made = np.dtype(dtype, copy=True) if copy else dtype  # a copy takes the byte order the pickle's state sets
    _load().dtypes.append(made)
    return made


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """numpy pickles an array as an empty one, then fills it from its state (raw bytes of the block)."""
    import numpy as np

    if (
        subtype is not NDARRAY
        or type(shape) is not tuple
        or any(type(n) is not int for n in shape)
        or np.prod(shape) != 0
        or type(dtype) is not bytes
    ):
        raise Refused("numpy's _reconstruct makes empty arrays only; their data comes from the block")
    array = np.ndarray.__new__(np.ndarray, shape, dtype)  # type: ignore[arg-type]  # bytes: a type code
    _load().arrays.append(array)
    return array


def _scalar(dtype: Any, data: Any = None) -> Any:
    import numpy as np

    _check_dtype(dtype, "numpy scalar")
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise Refused("a numpy scalar is made from exactly its dtype's bytes")
    return np.frombuffer(data, dtype=dtype)[0].copy()


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> Any:
    import numpy as np

    _check_dtype(dtype, "numpy array")
    data = _sized(buffer, (bytes, bytearray, pickle.PickleBuffer), "numpy array")
    if type(shape) is not tuple or any(type(n) is not int or n < 0 for n in shape) or order not in ("C", "F"):
        raise Refused("a numpy array's shape is a tuple of sizes")
    array = np.frombuffer(data, dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise Refused("a numpy array's shape does not match its bytes")
    array = array.reshape(shape, order=order).copy(order="K")
    _load().arrays.append(array)
    return array


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
    import torch
    from torch._utils import _rebuild_tensor_v2

    if not isinstance(storage, (torch.UntypedStorage, torch.TypedStorage)) or hooks or metadata:
        raise Refused("a tensor is rebuilt from a storage, with no backward hooks or metadata")
    return _rebuild_tensor_v2(
        storage,
        _int_arg(offset, "a tensor"),
        _sized(size, (tuple,), "a tensor's size"),
        _sized(stride, (tuple,), "a tensor's stride"),
        bool(requires_grad),
        hooks,
    )


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any) -> Any:
    import torch
    from torch._utils import _rebuild_parameter

    if not isinstance(data, torch.Tensor) or hooks:
        raise Refused("a parameter is rebuilt from a tensor, with no backward hooks")
    return _rebuild_parameter(data, bool(requires_grad), hooks)


def _torch_size(dims: Any = ()) -> Any:
    import torch

    return torch.Size(tuple(_int_arg(n, "torch.Size()") for n in _sized(dims, (tuple, list), "torch.Size()")))


# -- the table ------------------------------------------------------------------------------------------------------

_NUMPY = {"_reconstruct": _reconstruct, "scalar": _scalar}
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("builtins", t.__name__): _Factory(t) for t in (list, dict, tuple, set, frozenset, int, float, str, bool, bytes)
    },
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "complex"): _complex,
    ("builtins", "slice"): _slice,
    ("builtins", "range"): _range,
    ("collections", "OrderedDict"): _ordered_dict,
    ("collections", "defaultdict"): _defaultdict,
    ("collections", "deque"): _deque,
    ("collections", "Counter"): _counter,
    **{("datetime", n): getattr(datetime, n) for n in ("date", "datetime", "time", "timedelta", "timezone")},
    ("decimal", "Decimal"): _decimal,
    ("fractions", "Fraction"): _fraction,
    ("uuid", "UUID"): uuid.UUID,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("numpy", "ndarray"): NDARRAY,
    ("numpy", "dtype"): _dtype,
    **{(f"numpy.{core}.multiarray", name): fn for core in ("core", "_core") for name, fn in _NUMPY.items()},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _frombuffer for core in ("core", "_core")},
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch.storage", "_load_from_bytes"): _load_from_bytes,
    ("torch", "Size"): _torch_size,
}


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
        raise UnsafePickleError(
            f"refused to unpickle global {module}.{name}: it is not data the safe unpickler "
            f"knows; allow the class if it is yours (allowed_classes=['{module}.{name}']), "
            f"or trust the dataset (trusted=True)"
        )


def load(unpickler: type[RestrictedUnpickler], data: bytes | memoryview) -> tuple[Any, int]:
    """(what the block holds, an estimate of the bytes it takes in memory), refusing what breaks the policy."""
    size = len(data)
    state = _Load(Budget(AMPLIFICATION * size + FLOOR_BYTES), unpickler.user)
    previous = getattr(_current, "load", None)
    _current.load = state
    collecting = gc.isenabled()
    gc.disable()  # the allocation counter then counts every container made, with no collection resetting it
    try:
        before = gc.get_count()[0]
        value = unpickler(io.BytesIO(data)).load()
        containers = gc.get_count()[0] - before
    finally:
        if collecting:
            gc.enable()
        _current.load = previous
    for dtype in state.dtypes:
        _check_dtype(dtype, "numpy dtype")
    for array in state.arrays:
        _check_dtype(array.dtype, "numpy array")
    estimate = size * 3 // 2 + CONTAINER_BYTES * max(containers, 0) + state.budget.spent
    if estimate > state.budget.limit:
        raise Refused(
            f"unpickling built about {estimate:,} bytes from {size:,}: more than {AMPLIFICATION}x; "
            f"not data a block holds"
        )
    return value, estimate
