"""Examples into batches: what a DataLoader worker runs (numpy only), and the tensors the training process makes.

Workers hand batches over as numpy arrays, since torch's own hand-over of tensors from workers costs several
times more on a few cores (docs/peers.md). What cannot be collated is handed over as the error itself
(`Uncollated`), raised in the training process in one line, not as a worker's traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import CollateError
from ..read.expansion import EXPANSION, FLOOR_BYTES, MOST_DEPTH

LENGTHS = "_lengths"  # suffix of the key holding each row's length where a key's 1-D arrays were padded
NUMERIC = "biufc"
ADVICE = "make them one shape in the dataset (or with map=), or pass your own collate"


def collate_numpy(batch: list, pad: int | float = 0) -> Any:
    """torch's `default_collate`, to numpy, and ragged 1-D arrays padded.

    Numeric arrays of one shape are stacked; 1-D arrays of different lengths under one key are padded to the
    longest with `pad`, and `<key>_lengths` (int64) gives each row's length; numbers become arrays; strings,
    bytes and other objects stay lists; tensors are stacked (or padded) as arrays are. What cannot be one batch
    raises `CollateError` naming the key and the example.
    """
    if not batch:
        raise CollateError("an empty batch: nothing to collate")
    return _collate(list(batch), pad, "batch")


def _collate(values: list, pad: int | float, key: str, depth: int = 0) -> Any:
    first = values[0]
    if depth > MOST_DEPTH:  # it recurses a level at a time, as default_collate does
        raise CollateError(f"values nest more than {MOST_DEPTH} deep (at {key[:60]}...): {ADVICE}")
    kind = _kind(first)
    for k, value in enumerate(values):
        if _kind(value) != kind:
            raise CollateError(
                f"{key}: example 0 holds {_name(first)} and example {k} holds {_name(value)}: "
                f"one key must hold one kind of value in every example; {ADVICE}"
            )
    if kind == "mapping":
        keys = list(first)
        for k, value in enumerate(values):
            if value.keys() != first.keys():
                missing = [name for name in keys if name not in value] or [n for n in value if n not in first]
                raise CollateError(
                    f"{key}: example {k} has keys {_keys(value)}, example 0 has {_keys(first)} "
                    f"({missing[0]!r} differs): every example needs the same keys; {ADVICE}"
                )
        out: dict = {}
        for name in keys:
            column = [value[name] for value in values]
            out[name] = _collate(column, pad, f"key {name!r}" if key == "batch" else f"{key}[{name!r}]", depth + 1)
            lengths = _ragged_lengths(column)
            if lengths is not None and isinstance(name, str):
                out[name + LENGTHS] = lengths
        return out if type(first) is dict else _rebuild(first, out)
    if kind == "sequence":
        size = len(first)
        for k, value in enumerate(values):
            if len(value) != size:
                raise CollateError(
                    f"{key}: example {k} holds {len(value)} items, example 0 holds {size}: sequences in one batch "
                    f"must be of one length (a 1-D numpy array is padded instead); {ADVICE}"
                )
        columns = [_collate([value[i] for value in values], pad, f"{key}[{i}]", depth + 1) for i in range(size)]
        return type(first)(*columns) if hasattr(first, "_fields") else columns
    if kind == "array":
        return _stack([np.asarray(value) for value in values], pad, key)
    if kind == "tensor":
        return _stack_tensors(values, pad, key)
    if kind == "number":
        array = np.array(values, dtype=np.float64 if isinstance(first, float) else None)
        if array.dtype.kind not in NUMERIC:
            raise CollateError(f"{key}: numbers that make no numeric array ({array.dtype}); {ADVICE}")
        return array
    if kind == "none" and any(value is not None for value in values):
        raise CollateError(f"{key}: None in some examples, a value in others; {ADVICE}")
    return values  # strings, bytes, None, other objects: a list, as default_collate keeps strings


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (str, bytes)):
        return "text"
    if isinstance(value, (tuple, list)):
        return "sequence"
    if isinstance(value, np.ndarray):
        return "array" if value.dtype.kind in NUMERIC else "objects"
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return "number"
    if value is None:
        return "none"
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return "tensor"
    return "objects"


def _stack(arrays: list[np.ndarray], pad: int | float, key: str) -> np.ndarray:
    first = arrays[0]
    dtype = np.result_type(*arrays)
    if all(a.shape == first.shape for a in arrays):
        _within(key, len(arrays) * first.size * dtype.itemsize, arrays, dtype)
        return np.stack(arrays).astype(dtype, copy=False)
    if all(a.ndim == 1 for a in arrays):
        if not _fits(pad, dtype):
            raise CollateError(f"{key}: the pad value {pad!r} is not a {dtype} value: give a pad that is")
        longest = max(len(a) for a in arrays)
        _within(key, len(arrays) * longest * dtype.itemsize, arrays, dtype, longest)
        out = np.full((len(arrays), longest), pad, dtype=dtype)
        for row, array in zip(out, arrays):
            row[: len(array)] = array
        return out
    other = next(k for k, a in enumerate(arrays) if a.shape != first.shape)
    raise CollateError(
        f"{key}: example 0 holds an array of shape {first.shape}, example {other} one of shape "
        f"{arrays[other].shape}: only 1-D arrays are padded; {ADVICE}"
    )


def _held(arrays: list) -> int:
    """The bytes a batch's arrays (or tensors) hold, each buffer once: 64 references to one array hold one."""
    owners: dict[int, int] = {}
    for array in arrays:
        if isinstance(array, np.ndarray):
            owner, size = id(array if array.base is None else array.base), array.nbytes
        else:  # a torch tensor: its storage
            owner, size = array.untyped_storage().data_ptr(), array.untyped_storage().nbytes()
        owners[owner] = max(owners.get(owner, 0), size)
    return sum(owners.values())


def _within(key: str, size: int, arrays: list, dtype: Any, longest: int | None = None) -> None:
    """A batch of `size` bytes is made only within what its examples justify (read/expansion.py's bound: up to
    FLOOR_BYTES, and past that EXPANSION times what they hold): padding every row to the longest, a wider dtype
    for all (one complex128 row makes every row 16 bytes an item) and one array referred to by every example
    multiply it; 734 stored bytes asked for a batch of 1 GiB, one complex128 row 16 GiB."""
    if size <= FLOOR_BYTES:  # what any batch may be: its arrays need not be looked at
        return
    held = _held(arrays)
    if size > FLOOR_BYTES + EXPANSION * held:
        how = f"padded to the longest ({longest:,}) " if longest is not None else ""
        raise CollateError(
            f"{key}: {len(arrays)} rows {how}as {dtype} make {size:,} bytes from the {held:,} the examples hold: "
            f"{ADVICE}; bucket rows by length, or store one dtype"
        )


def _fits(pad: int | float, dtype: np.dtype) -> bool:
    with np.errstate(all="ignore"):
        try:
            return bool(np.array(pad).astype(dtype) == pad)
        except (OverflowError, ValueError):
            return False


def _stack_tensors(tensors: list, pad: int | float, key: str) -> Any:
    """Tensors stacked (or padded) as arrays are, in torch (bfloat16 has no numpy dtype)."""
    import torch

    first = tensors[0]
    dtype = first.dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if all(t.shape == first.shape for t in tensors):
        _within(key, len(tensors) * first.nelement() * itemsize, tensors, dtype)
        return torch.stack([t.to(dtype) for t in tensors])
    if all(t.ndim == 1 for t in tensors):
        longest = max(len(t) for t in tensors)
        _within(key, len(tensors) * longest * itemsize, tensors, dtype, longest)
        out = torch.full((len(tensors), longest), pad, dtype=dtype)
        for row, tensor in zip(out, tensors):
            row[: len(tensor)] = tensor
        return out
    other = next(k for k, t in enumerate(tensors) if t.shape != first.shape)
    raise CollateError(
        f"{key}: example 0 holds a tensor of shape {tuple(first.shape)}, example {other} one of shape "
        f"{tuple(tensors[other].shape)}: only 1-D tensors are padded; {ADVICE}"
    )


def _ragged_lengths(column: list) -> np.ndarray | None:
    """Each row's length, where a key's values are 1-D arrays (or tensors) of different lengths."""
    if _kind(column[0]) not in ("array", "tensor") or any(getattr(v, "ndim", 0) != 1 for v in column):
        return None
    lengths = np.array([len(v) for v in column], dtype=np.int64)
    return lengths if len(lengths) and lengths.min() != lengths.max() else None


def _rebuild(first: Mapping, out: dict) -> Any:
    try:
        return type(first)(out)  # type: ignore[call-arg]
    except TypeError:
        return out


def _name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    return f"a {type(value).__name__}"


def _keys(value: Mapping) -> str:
    shown = ", ".join(repr(k) for k in list(value)[:6])
    return f"[{shown}{', ...' if len(value) > 6 else ''}]"


class Uncollated:
    """What a worker hands over instead of a batch it could not collate: the error, raised in the training
    process where the batch is converted (`to_tensors`) or first used."""

    def __init__(self, error: CollateError) -> None:
        self.error = error

    def _raise(self, *args: Any) -> Any:
        raise self.error

    __getitem__ = __iter__ = __len__ = __contains__ = _raise


def guarded(collate: Callable[[list], Any]) -> Callable[[list], Any]:
    """`collate`, with a CollateError handed over as the batch (see `Uncollated`)."""
    return _Guarded(collate)


class _Guarded:  # a class, not a closure: it goes to spawned workers pickled
    def __init__(self, collate: Callable[[list], Any]) -> None:
        self.collate = collate

    def __call__(self, batch: list) -> Any:
        try:
            return self.collate(batch)
        except CollateError as error:
            return Uncollated(error)


def to_tensors(batch: Any, dtypes: Mapping[str, Any] | None = None) -> Any:
    """A worker's numpy batch as torch tensors (torch's `default_convert`), in the training process: unsigned
    integers wider than a byte as int64 (torch indexes with int64; nn.Embedding refuses uint16), or as
    `dtypes` says for a key (e.g. {"tokens": torch.int32})."""
    import torch
    from torch.utils.data import default_convert

    if isinstance(batch, Uncollated):
        raise batch.error
    dtypes = dict(dtypes or {})
    if dtypes and not isinstance(batch, Mapping):
        raise ValueError(f"dtypes name keys of a batch, but the batch is a {type(batch).__name__}, not a dict")
    unknown = [key for key in dtypes if key not in batch]
    if unknown:
        raise ValueError(f"dtypes names {unknown[0]!r}, which the batch does not have (its keys: {_keys(batch)})")
    if isinstance(batch, Mapping):
        converted = {key: _widened(value) if key not in dtypes else value for key, value in batch.items()}
        tensors = default_convert(converted)
        for key, dtype in dtypes.items():
            tensors[key] = torch.as_tensor(tensors[key]).to(dtype)
        return tensors
    return default_convert(_widened(batch))


def _widened(value: Any) -> Any:
    """Unsigned integer arrays of 2 bytes or more as int64, through containers."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "u" and value.dtype.itemsize > 1:
        if value.dtype.itemsize == 8 and value.size and int(value.max()) > np.iinfo(np.int64).max:
            raise CollateError(
                f"uint64 values up to {int(value.max())} do not fit int64: give dtypes= for this key, or store "
                f"smaller integers"
            )
        return value.astype(np.int64)
    if isinstance(value, Mapping):
        return {key: _widened(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_widened(item) for item in value]
    return value
