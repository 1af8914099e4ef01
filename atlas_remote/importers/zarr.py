"""L5Kit zarr v2 stores (`scenes`, `frames`, `agents`, `traffic_light_faces`), read by hand: each array's
`.zarray` JSON, its chunks decompressed with numcodecs, `np.frombuffer` with the structured dtype. (zarr-python
3 cannot read these dtypes.) One example per frame:
`{"scene_index": int, "frame_index": int, "frame": {field: numpy value}, "agents": structured array,
"traffic_light_faces": structured array}`. Every chunk is read once, streaming, never once per frame.
"""

from __future__ import annotations

import bz2
import json
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from ..errors import FormatError, ObjectNotFoundError
from .sources import INFLATION_FREE_BYTES, INFLATION_RATIO, expand, read_small, source

ARRAYS = ("scenes", "frames", "agents", "traffic_light_faces")


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    return [url.rstrip("/") for url in expand(src, storage_options)]


def _dtype(spec: Any) -> np.dtype:
    if isinstance(spec, list):  # structured: [[name, type], [name, type, shape], ...]
        return np.dtype([(f[0], _dtype(f[1]), tuple(f[2])) if len(f) == 3 else (f[0], _dtype(f[1])) for f in spec])
    return np.dtype(spec)


ZARRAY_BYTES = 1 << 20  # L5Kit's are under 2 KB
MAX_CHUNK_BYTES = 256 << 20  # a decoded chunk, held while its elements are read
COMPRESSORS = ("blosc", "zstd", "lz4", "zlib", "gzip", "bz2")


class Inflation:
    """What one store's chunks may decode to, together: INFLATION_FREE_BYTES, and INFLATION_RATIO bytes more per
    compressed byte read of it, as for every compressed source (sources.Inflation). Once per store, not per chunk: 60
    chunks of 500 bytes each declaring 16 MiB (a 32 KB store) took 2 GB and 12.6 s before the first example."""

    def __init__(self) -> None:
        self.read = self.decoded = 0

    def charge(self, stored: int, decoded: int, url: str) -> None:
        self.read += stored
        self.decoded += decoded
        if self.decoded > INFLATION_FREE_BYTES + INFLATION_RATIO * self.read:
            raise FormatError(
                f"the store's chunks read so far, {self.read:,} bytes, decode to {self.decoded:,}: more than "
                f"{INFLATION_RATIO} times as many (a decompression bomb?); if the store is sound, rewrite it "
                f"uncompressed and convert that",
                url=url,
            )


class ZarrArray:
    """One 1-D zarr v2 array: its metadata, and its chunks fetched and decoded on demand.

    Its `.zarray` comes from a stranger like the chunks: its dtype must hold plain data, a chunk decoded must fit
    MAX_CHUNK_BYTES, and its codecs are the compressors L5Kit's stores use, decoded here with their output bounded
    (numcodecs' registry would also take `pickle`, whose decode is pickle.loads, and decoders that allocate what a
    chunk's header claims). A chunk must decode to exactly its elements' bytes, within the inflation bound that
    applies to every compressed source (sources.Inflation)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, inflation: Inflation | None = None) -> None:
        self.url = url
        self.inflation = inflation if inflation is not None else Inflation()
        self.store = source(url, storage_options)
        try:
            meta = json.loads(read_small(self.store, ".zarray", ZARRAY_BYTES))
        except ObjectNotFoundError as err:
            raise ObjectNotFoundError("no .zarray: not a zarr v2 array", url=url) from err
        except (ValueError, RecursionError) as err:
            raise FormatError(f"its .zarray is not JSON ({type(err).__name__}: {err})", url=url) from err
        if not isinstance(meta, dict) or meta.get("zarr_format") != 2 or not _one_count(meta.get("shape"), 0):
            shape = meta.get("shape") if isinstance(meta, dict) else None
            raise FormatError(
                f"expected a 1-D zarr v2 array, got {str(meta)[:100] if shape is None else f'shape {shape}'}", url=url
            )
        if not _one_count(meta.get("chunks"), 1):
            raise FormatError(f"chunks must be one whole number above 0, got {meta.get('chunks')!r}", url=url)
        self.length, self.chunk = meta["shape"][0], meta["chunks"][0]
        try:
            self.dtype = _dtype(meta.get("dtype"))
        except Exception as err:  # numpy's parser of a dtype spec raises TypeError, ValueError, KeyError...
            raise FormatError(f"dtype {str(meta.get('dtype'))[:100]} is not a numpy dtype ({err})", url=url) from err
        if self.dtype.hasobject or self.dtype.itemsize == 0:
            raise FormatError(f"dtype {self.dtype} does not hold plain data", url=url)
        self.chunk_bytes = self.chunk * self.dtype.itemsize
        if self.chunk_bytes > MAX_CHUNK_BYTES:
            raise FormatError(
                f"a chunk of {self.chunk:,} elements of {self.dtype.itemsize} bytes is {self.chunk_bytes:,} bytes, "
                f"above the {MAX_CHUNK_BYTES:,} a chunk may hold: rechunk the store",
                url=url,
            )
        if meta.get("filters"):
            raise FormatError(f"filters {meta['filters']!r}: L5Kit's stores have none, and none are read", url=url)
        self.compressor = meta.get("compressor")
        if self.compressor is not None and (
            not isinstance(self.compressor, dict) or self.compressor.get("id") not in COMPRESSORS
        ):
            raise FormatError(
                f"compressor {str(self.compressor)[:100]}: only {', '.join(COMPRESSORS)} are read", url=url
            )

    def read_chunk(self, number: int) -> np.ndarray:
        where = f"{self.url}/{number}"
        try:
            raw = self.store.read(str(number), "source")
        except ObjectNotFoundError as err:
            raise FormatError(
                f"chunk {number} is missing (holding elements {number * self.chunk}.."
                f"{min((number + 1) * self.chunk, self.length) - 1})",
                url=where,
            ) from err
        if self.compressor is not None:
            self.inflation.charge(len(raw), self.chunk_bytes, where)
        array = np.frombuffer(_decode(self.compressor, raw, self.chunk_bytes, where), self.dtype)
        return array[: min(self.chunk, self.length - number * self.chunk)]


def _one_count(value: Any, least: int) -> bool:
    return isinstance(value, list) and len(value) == 1 and type(value[0]) is int and value[0] >= least


def _decode(compressor: dict | None, raw: bytes, expected: int, url: str) -> bytes:
    """A chunk's bytes, which must be exactly `expected`: compressed ones decoded only if their header declares
    that size (blosc, lz4) or with their output capped just past it (zstd, zlib, gzip, bz2)."""
    try:
        data = raw if compressor is None else _decompress(compressor["id"], raw, expected)
    except FormatError:
        raise
    except Exception as err:  # each codec's own errors
        raise FormatError(f"the chunk does not decode ({type(err).__name__}: {err})", url=url) from err
    if len(data) != expected:
        raise FormatError(f"the chunk decodes to {len(data):,} bytes, expected {expected:,}", url=url)
    return data


def _decompress(kind: str, raw: bytes, expected: int) -> bytes:
    if kind in ("blosc", "lz4"):
        import numcodecs

        # blosc's 16-byte header holds the decoded size at bytes 4-8; numcodecs' lz4 prefixes it in 4 bytes
        declared = int.from_bytes(raw[4:8] if kind == "blosc" else raw[:4], "little")
        if declared != expected:  # checked before numcodecs allocates what the header declares
            raise ValueError(f"its header declares {declared:,} decoded bytes")
        return bytes(numcodecs.get_codec({"id": kind}).decode(raw))
    if kind == "zstd":
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
            return reader.read(expected + 1)
    if kind == "bz2":
        return bz2.BZ2Decompressor().decompress(raw, expected + 1)
    return zlib.decompressobj(31 if kind == "gzip" else 15).decompress(raw, expected + 1)


class Window:
    """Reads a zarr array forward: slices that never overlap or go back, within the array, each chunk fetched
    once. (Overlapping intervals would copy the same elements into every frame: a few bytes of intervals could
    make each example the whole array.)"""

    def __init__(self, array: ZarrArray) -> None:
        self.array = array
        self.start, self.data = 0, np.empty(0, array.dtype)
        self.stop = 0  # where the last slice ended

    def slice(self, start: int, stop: int) -> np.ndarray:
        if not self.stop <= start <= stop <= self.array.length:
            raise FormatError(
                f"interval [{start}, {stop}) after one ending at {self.stop}: frames must reference consecutive "
                f"elements, in order, within the array's {self.array.length}",
                url=self.array.url,
            )
        self.stop = stop
        chunk = self.array.chunk
        end = self.start + len(self.data)
        if start >= end:  # drop what is behind, jump to the chunk holding start
            self.start, self.data = (start // chunk) * chunk, np.empty(0, self.array.dtype)
            end = self.start
        else:  # keep only the part from start's chunk on
            keep = (start // chunk) * chunk
            self.data, self.start = self.data[keep - self.start :], keep
        parts = [self.data]
        while end < stop:  # gathered, then joined once (joined chunk by chunk, reading is quadratic)
            parts.append(self.array.read_chunk(end // chunk))
            end += len(parts[-1])
        if len(parts) > 1:
            self.data = np.concatenate(parts)
        return self.data[start - self.start : stop - self.start].copy()


# The fields samples() reads, each a pair of element indices: L5Kit's layout
INTERVALS = {
    "scenes": ("frame_index_interval",),
    "frames": ("agent_index_interval", "traffic_light_faces_index_interval"),
}


def _check_intervals(array: ZarrArray) -> None:
    for name in INTERVALS.get(array.url.rsplit("/", 1)[-1], ()):
        fields = array.dtype.fields
        field = fields[name][0] if fields is not None and name in fields else None
        if field is None or field.shape != (2,) or field.base.kind not in "iu":
            raise FormatError(f"no field {name!r} of two integers: not an L5Kit array", url=array.url)


def samples(stores: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[dict]:
    for store in inputs(stores, storage_options):
        inflation = Inflation()  # one for the store's arrays together
        arrays = {name: ZarrArray(f"{store}/{name}", storage_options, inflation) for name in ARRAYS}
        for array in arrays.values():
            _check_intervals(array)
        scenes = Window(arrays["scenes"]).slice(0, arrays["scenes"].length)
        scene_starts = scenes["frame_index_interval"][:, 0] if len(scenes) else np.zeros(0, np.int64)
        agents, faces = Window(arrays["agents"]), Window(arrays["traffic_light_faces"])
        frames = arrays["frames"]
        for number in range(-(-frames.length // frames.chunk)):
            for offset, frame in enumerate(frames.read_chunk(number)):
                index = number * frames.chunk + offset
                a0, a1 = (int(v) for v in frame["agent_index_interval"])
                t0, t1 = (int(v) for v in frame["traffic_light_faces_index_interval"])
                yield {
                    "scene_index": int(np.searchsorted(scene_starts, index, side="right") - 1),
                    "frame_index": index,
                    "frame": {
                        name: frame[name].copy() if isinstance(frame[name], np.ndarray) else frame[name]
                        for name in frames.dtype.names or ()
                    },
                    "agents": agents.slice(a0, a1),
                    "traffic_light_faces": faces.slice(t0, t1),
                }
