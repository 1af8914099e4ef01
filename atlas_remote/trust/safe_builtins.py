"""The allowed globals of builtins, collections, numbers and copyreg as a block gets them (see `unpickler`): each
frozen (every block shares it), taking only the arguments data needs and charging what it allocates to the block
being loaded (`Budget`, found through `current()`). `docs/security.md` lists them and why each is safe."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

from . import walk_graph as wg
from .walk_graph import AMPLIFICATION, MAX_BLOCK_MULTIPLE, Refused

MAX_DIGITS = 4300  # Python's own bound on int(str), applied to Decimal and Fraction too


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


class LoadState:
    """The state of one block's unpickling, which the wrappers see."""

    def __init__(self, budget: Budget, user: frozenset[tuple[str, str]]) -> None:
        self.budget, self.user = budget, user
        self.dtypes: list = []
        self.arrays: list = []
        self.tensors: list = []


CURRENT = threading.local()  # the LoadState of the block this thread is loading


def _load() -> LoadState:
    return CURRENT.load


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


_FACTORIES = (list, dict, tuple, set, frozenset, int, float, str, bool, bytes)
_DATED = ("date", "datetime", "time", "timedelta", "timezone")  # immutable C types; their hashes are randomized
BUILTINS: dict[tuple[str, str], tuple[Any, int]] = {  # a global: what a block gets, what the walk says it makes
    **{("builtins", t.__name__): (_Factory(t), makes) for t, makes in zip(_FACTORIES, range(wg.F_BYTES + 1))},
    ("builtins", "bytearray"): (_frozen(_bytearray), wg.M_BYTEARRAY),
    ("builtins", "complex"): (_frozen(_complex), wg.M_OBJ),
    ("builtins", "slice"): (_frozen(_slice), wg.M_OBJ),
    ("builtins", "range"): (_frozen(_range), wg.M_OBJ),
    ("collections", "OrderedDict"): (_frozen(_ordered_dict), wg.M_ODICT),
    ("collections", "defaultdict"): (_frozen(_defaultdict), wg.M_DDICT),
    ("collections", "deque"): (_frozen(_deque), wg.M_DEQUE),
    ("collections", "Counter"): (_frozen(_counter), wg.M_COUNTER),
    **{("datetime", n): (getattr(datetime, n), wg.C_DATED) for n in _DATED},
    ("decimal", "Decimal"): (_frozen(_decimal), wg.M_OBJ),
    ("fractions", "Fraction"): (_frozen(_fraction), wg.M_OBJ),
    ("uuid", "UUID"): (uuid.UUID, wg.C_OBJ),  # a class (NEWOBJ takes only classes); BUILD on it fails, see security.md
    ("copyreg", "_reconstructor"): (_frozen(_reconstructor), wg.M_USER),
}
