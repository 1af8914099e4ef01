"""The restricted unpickler: a block from someone else's bucket may build data, never run code, forge a pointer or
make memory out of nothing.

A pickle runs whatever callables its globals name, with the arguments it supplies. So each global a block may
name is judged by what it can do with hostile arguments, and most are handed over wrapped: a wrapper takes only
the arguments that data needs (a bytearray from bytes, never from a size; a set from a list, never from a
range), charges what it allocates to the block's budget, and refuses the rest. numpy arrays and dtypes are
allowed in their plain kinds only (numbers, booleans, strings, datetimes, and records of those, rebuilt and
compared, since a dtype's pickled state can claim a field holds no objects and so forge pointers), and are
checked again once the block is loaded. torch tensors load their storage with torch's own `weights_only`
loader, after its declared size is checked against the bytes that carry it.

What the pickle's own opcodes build is bounded before anything is loaded, mostly without reading the block:
every opcode but EMPTY_SET and FROZENSET builds at most OPCODE_BYTES per byte it takes, so the block's size and
a count of those two bytes (when present at all) bound it. A block the bound does not clear is walked opcode by opcode
(`opcode_charges`), charging what each makes at CPython's sizes, and refused as soon as the charges pass the
limit. Opcodes and wrappers share one limit: AMPLIFICATION times the decompressed size plus a floor, never more
than twice `max_block_bytes`. `docs/security.md` lists every global, why it is safe, the bound's figures and
what was tried against it; `trusted=True` is plain pickle.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import math
import pickle
import pickletools
import re
import sys
import threading
import uuid
import warnings
from typing import Any

from .errors import UnsafePickleError

AMPLIFICATION = 128  # what a block may build, as a multiple of its decompressed bytes (above FLOOR_BYTES)
FLOOR_BYTES = 1 << 20
MAX_BLOCK_MULTIPLE = 2  # ... and never more than this many times max_block_bytes, however large the block
OPCODE_BYTES = 80  # the most any opcode but EMPTY_SET and FROZENSET builds per byte of the block (an empty dict: 72)
SET_BYTES = sys.getsizeof(set()) + 16  # an empty set or frozenset (216 bytes) from one byte, with its stack slot
MAX_DIGITS = 4300  # Python's own bound on int(str), applied to Decimal and Fraction too
NUMPY_KINDS = "biufcmMSUV"  # bool, int, uint, float, complex, datetime, timedelta, bytes, str, void (raw/records)


def limit_for(size: int, max_block_bytes: int) -> int:
    """The most a block of `size` decompressed bytes may build."""
    return min(AMPLIFICATION * size + FLOOR_BYTES, MAX_BLOCK_MULTIPLE * max_block_bytes)


class Refused(UnsafePickleError):
    """A global called with arguments that data never needs (a size, an iterable, a structured dtype...)."""


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


# -- what opcodes build --------------------------------------------------------------------------------------------

SLOT = 16  # a reference on the unpickler's stack, with the stack's growth
ITEM = 100  # what one more item can make its container grow by (a set's table grows to 6.7 slots of 16 bytes an item)
PER_OPCODE = 256  # charged at least, for every opcode: a walk refused at the limit stops within limit / 256 opcodes
LINE, LINES, LEN1, LEN4, SLEN4, LEN8 = -1, -2, -3, -4, -5, -6  # an argument read to the end of one or two
# lines, or after its length (1, 4, 4 signed or 8 bytes); a positive form is the opcode's whole fixed length
_LENGTHS = {
    pickletools.TAKEN_FROM_ARGUMENT1: LEN1,
    pickletools.TAKEN_FROM_ARGUMENT4: SLEN4,
    pickletools.TAKEN_FROM_ARGUMENT4U: LEN4,
    pickletools.TAKEN_FROM_ARGUMENT8U: LEN8,
}
_WIDTHS = {LEN1: 1, LEN4: 4, SLEN4: 4, LEN8: 8}
_TEXT = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_INTS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_REFS = frozenset({"NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE", "GET", "BINGET", "LONG_BINGET", "DUP"})
_CALLS = frozenset({"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "EXT1", "EXT2", "EXT4"})
_MADE = {  # what each opcode that pushes a new value makes, at CPython's sizes (sys.getsizeof of the empty value)
    **dict.fromkeys(_REFS, 0),
    **dict.fromkeys(_INTS, sys.getsizeof(2**40)),
    **dict.fromkeys(("FLOAT", "BINFLOAT"), sys.getsizeof(0.0)),
    **dict.fromkeys(_TEXT, sys.getsizeof("\U0001f600")),  # the header of the widest kind; characters charged apart
    **dict.fromkeys(("BINBYTES", "SHORT_BINBYTES", "BINBYTES8"), sys.getsizeof(b"")),
    "BYTEARRAY8": sys.getsizeof(bytearray()),
    **dict.fromkeys(("NEXT_BUFFER", "READONLY_BUFFER", "PERSID", "BINPERSID"), sys.getsizeof(memoryview(b""))),
    **dict.fromkeys(("EMPTY_LIST", "LIST"), sys.getsizeof([])),
    **dict.fromkeys(("EMPTY_DICT", "DICT"), sys.getsizeof({})),
    **dict.fromkeys(("EMPTY_SET", "FROZENSET"), sys.getsizeof(set())),
    **dict.fromkeys(("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"), sys.getsizeof((0, 0, 0))),
    **dict.fromkeys(_CALLS, 64),  # wrappers charge what they allocate themselves
}
MEMO_PUT, LINE_TEXT, FRAME, STOP = 1, 2, 3, 4  # opcodes the walk looks at beyond their charge
_SPECIAL = {
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), MEMO_PUT),
    **dict.fromkeys(("INT", "LONG", "FLOAT", "STRING", "UNICODE"), LINE_TEXT),
    "FRAME": FRAME,
    "STOP": STOP,
}


def _opcode_table() -> tuple[list[int], list[int], list[int], list[bool], list[str]]:
    """For each byte value: how its opcode's argument is read (0 for a byte that is no opcode), what the opcode
    is charged, what the walk does beyond charging it, whether its payload is text, and its name."""
    forms, charges, special, text, names = [0] * 256, [0] * 256, [0] * 256, [False] * 256, [""] * 256
    for op in pickletools.opcodes:
        code, arg = op.code.encode("latin-1")[0], op.arg
        if arg is None or arg.n >= 0:
            forms[code] = 1 + (arg.n if arg else 0)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            forms[code] = LINES if arg.name == "stringnl_noescape_pair" else LINE
        else:
            forms[code] = _LENGTHS[arg.n]
        made = _MADE.get(op.name)
        charges[code] = PER_OPCODE if made is None else max(PER_OPCODE, made + SLOT + ITEM)
        special[code] = _SPECIAL.get(op.name, 0)
        text[code] = op.name in _TEXT
        names[code] = op.name
    return forms, charges, special, text, names


_FORMS, _CHARGES, _SPECIALS, _TEXTS, _NAMES = _opcode_table()


def opcode_bound(data: bytes, limit: int) -> int:
    """An upper bound of what the block's opcodes build, from its size and its count of the two set opcodes'
    bytes when that clears the limit; otherwise their exact charges (`opcode_charges`), which refuse the block
    past the limit."""
    size = len(data)
    if OPCODE_BYTES * size > limit:
        return opcode_charges(data, limit)
    sets = data.count(pickle.EMPTY_SET) + data.count(pickle.FROZENSET)  # exact, and as fast as one masked pass
    bound = OPCODE_BYTES * size + (SET_BYTES - OPCODE_BYTES) * sets
    return bound if bound <= limit else opcode_charges(data, limit)


def opcode_charges(data: bytes, limit: int) -> int:
    """What the block's opcodes build, charged opcode by opcode at CPython's sizes with room for every container's
    growth (an upper bound, tested against tracemalloc), before any of it is built. Refused past `limit`; a
    block that is no pickle (a length past its end, a byte that is no opcode) raises ValueError."""
    size, at, charged, memo = len(data), 0, 0, 0
    forms, charges, specials, texts = _FORMS, _CHARGES, _SPECIALS, _TEXTS
    while at < size:
        code = data[at]
        form = forms[code]
        charged += charges[code]
        if form > 0:
            start = end = at + form
        elif form == LEN1:  # the common counted form: short strings and bytes
            start = at + 2
            end = start + data[at + 1]
            charged += (end - start) * (1 if not texts[code] or data[start:end].isascii() else 4)
        elif form < LEN1:
            start = at + 1 + _WIDTHS[form]
            length = int.from_bytes(data[at + 1 : start], "little", signed=form == SLEN4)
            end = start + length
            if length < 0 or end > size:
                raise ValueError(f"{_NAMES[code]} at byte {at} claims {length:,} bytes past the block's end")
            charged += length * (1 if not texts[code] or data[start:end].isascii() else 4)
        elif form:  # LINE or LINES
            start, end = at + 1, data.find(b"\n", at + 1)
            if form == LINES and end >= 0:
                end = data.find(b"\n", end + 1)
            if end < 0:
                raise ValueError(f"{_NAMES[code]} at byte {at} has no end of line")
            end += 1
        else:
            raise ValueError(f"byte {code:#04x} at {at} is not a pickle opcode")
        special = specials[code]
        if special:
            if special == STOP:
                return charged
            if special == MEMO_PUT:
                index = int(data[start:end]) if form == LINE else int.from_bytes(data[at + 1 : end], "little")
                if not 0 <= index <= size:  # a pickler numbers its memo from 0, one entry per opcode
                    raise Refused(f"{_NAMES[code]} at byte {at} names memo entry {index:,}, past any pickler's")
                if index >= memo:  # the C unpickler's memo is an array, doubled as it grows
                    charged, memo = charged + 2 * 8 * (index + 1 - memo), index + 1
            elif special == LINE_TEXT:
                charged += 4 * (end - start)
            else:  # FRAME: read into a buffer of its own
                length = int.from_bytes(data[at + 1 : end], "little")
                if length > size - end:
                    raise ValueError(f"FRAME at byte {at} claims {length:,} bytes past the block's end")
                charged += length
        if end > size:
            raise ValueError(f"{_NAMES[code]} at byte {at} runs past the block's end")
        if charged > limit:
            raise Refused(
                f"its pickle opcodes would build more than {limit:,} bytes from {size:,} ({AMPLIFICATION}x, and at "
                f"most {MAX_BLOCK_MULTIPLE}x max_block_bytes): not data a block holds"
            )
        at = end
    raise ValueError("the pickle ends before its STOP opcode")


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


def load(
    unpickler: type[RestrictedUnpickler], data: bytes | memoryview, max_block_bytes: int, signed: bool = False
) -> Any:
    """What the block holds, refusing what breaks the policy: what its opcodes build is bounded before loading
    (unless the block is signed: built by the user's own writer), what allowed globals build is charged as they
    build it, and numpy dtypes are checked again once set."""
    data = data if type(data) is bytes else bytes(data)  # io.BytesIO would copy it all the same
    limit = limit_for(len(data), max_block_bytes)
    opcodes = 0 if signed else opcode_bound(data, limit)
    state = _Load(Budget(limit - opcodes), unpickler.user)
    previous = getattr(_current, "load", None)
    _current.load = state
    try:
        value = unpickler(io.BytesIO(data)).load()
    finally:
        _current.load = previous
    for dtype in state.dtypes:
        _check_dtype(dtype, "numpy dtype")
    for array in state.arrays:
        _check_dtype(array.dtype, "numpy array")
    return value
