"""Users' functions on the way into a dataset (`map=`, `build(fn, ...)`): named, so that worker processes can
import them, and their failures named by what they were given (the input and the example number)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import FormatError


def function_name(fn: Callable[..., Any] | str) -> str:
    """A function as the "module:function" a worker process imports (a lambda or a local function has none)."""
    if isinstance(fn, str):
        return fn
    name = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if "<" in name or name.startswith(":") or name.startswith("__main__:"):
        raise ValueError(
            f"{fn!r} must be a function defined at the top level of an importable module (workers import it "
            f"by name), or its 'module:function' name"
        )
    return name


def label(fn: Callable[..., Any] | str) -> str:
    """How a function is named in messages, importable or not."""
    return fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))


def resolve_function(name: str) -> Callable[..., Any]:
    module, _, attribute = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"function {name!r} cannot be imported ({err}); give it as module:function") from err
    return target


def callable_of(fn: Callable[..., Any] | str) -> Callable[..., Any]:
    return resolve_function(fn) if isinstance(fn, str) else fn


def failure(what: str, number: int | None, err: Exception, source: str | None) -> FormatError:
    at = f"on example {number}" if number is not None else "before its first example"
    return FormatError(
        f"{what} failed {at} of this input ({type(err).__name__}: {err}); nothing was committed", url=source
    )


def mapped(examples: Iterator[Any], fn: Callable[..., Any] | str, source: str | None) -> Iterator[Any]:
    """fn over examples: an example, a list of examples, or None (dropped) for each."""
    call = callable_of(fn)
    for number, example in enumerate(examples):
        try:
            out = call(example)
        except Exception as err:
            raise failure(f"the map function {label(fn)}", number, err, source) from err
        if isinstance(out, list):
            yield from out
        elif out is not None:
            yield out


def generated(fn: Callable[..., Any] | str, unit: Any, source: str) -> Iterator[Any]:
    """The examples fn(unit) returns or yields (an iterable of them; None for none)."""
    what = f"the function {label(fn)}"
    number = None
    try:
        produced = callable_of(fn)(unit)
        if produced is None:
            return
        if isinstance(produced, (dict, str, bytes)):
            raise TypeError(
                f"it returned a {type(produced).__name__}, not examples: yield them, or return a list of them"
            )
        number = 0
        for example in produced:
            yield example
            number += 1
    except Exception as err:
        raise failure(what, number, err, source) from err


def token_arrays(examples: Iterator[Any], key: str, dtype: str, source: str | None) -> Iterator[Any]:
    """Each example's token ids under `key` (a list from JSON lines or Parquet, or an array of another type) as a
    1-D array of `dtype`, what a TokenStream packs: every id checked to fit (numpy would wrap 70,000 into a uint16,
    and cut 1.5 to 1)."""
    wanted = np.dtype(dtype)
    if wanted.kind not in "iu":
        raise ValueError(f"dtype must be an integer type for token ids (uint16, uint32, int64...), got {dtype!r}")
    low, high = np.iinfo(wanted).min, np.iinfo(wanted).max
    for number, example in enumerate(examples):
        if not isinstance(example, dict) or key not in example:
            raise failure(f"--tokens {key}", number, KeyError(f"no {key!r} in the example"), source)
        ids = np.asarray(example[key])
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            problem = f"{key!r} holds {ids.dtype} of shape {ids.shape}, not a list of integer token ids"
            raise failure(f"--tokens {key}", number, ValueError(problem), source)
        if ids.size and (int(ids.min()) < low or int(ids.max()) > high):
            problem = f"token ids from {int(ids.min())} to {int(ids.max())} do not fit {wanted} (give a wider --dtype)"
            raise failure(f"--tokens {key}", number, ValueError(problem), source)
        yield {**example, key: ids.astype(wanted)}
