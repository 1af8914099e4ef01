"""L5Kit zarr v2 stores (`scenes`, `frames`, `agents`, `traffic_light_faces`), read by hand: each array's
`.zarray` JSON, its chunks decompressed with numcodecs, `np.frombuffer` with the structured dtype. (zarr-python
3 cannot read these dtypes.) One example per frame:
`{"scene_index": int, "frame_index": int, "frame": {field: numpy value}, "agents": structured array,
"traffic_light_faces": structured array}`. Every chunk is read once, streaming, never once per frame.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import FormatError, ObjectNotFoundError
from .sources import expand, source

ARRAYS = ("scenes", "frames", "agents", "traffic_light_faces")


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    return [url.rstrip("/") for url in expand(src, storage_options)]


def _dtype(spec: Any) -> np.dtype:
    if isinstance(spec, list):  # structured: [[name, type], [name, type, shape], ...]
        return np.dtype([(f[0], _dtype(f[1]), tuple(f[2])) if len(f) == 3 else (f[0], _dtype(f[1])) for f in spec])
    return np.dtype(spec)


class ZarrArray:
    """One 1-D zarr v2 array: its metadata, and its chunks fetched and decoded on demand."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        self.url = url
        self.store = source(url, storage_options)
        try:
            meta = json.loads(self.store.read(".zarray", "source"))
        except ObjectNotFoundError as err:
            raise ObjectNotFoundError("no .zarray: not a zarr v2 array", url=url) from err
        if meta.get("zarr_format") != 2 or len(meta["shape"]) != 1:
            raise FormatError(
                f"expected a 1-D zarr v2 array, got format {meta.get('zarr_format')} shape {meta['shape']}", url=url
            )
        self.length, self.chunk = int(meta["shape"][0]), int(meta["chunks"][0])
        self.dtype = _dtype(meta["dtype"])
        self.order = meta.get("order", "C")
        self.codecs = [c for c in (meta.get("filters") or [])] + (
            [meta["compressor"]] if meta.get("compressor") else []
        )

    def read_chunk(self, number: int) -> np.ndarray:
        try:
            raw = self.store.read(str(number), "source")
        except ObjectNotFoundError as err:
            raise FormatError(
                f"chunk {number} is missing (holding elements {number * self.chunk}.."
                f"{min((number + 1) * self.chunk, self.length) - 1})",
                url=f"{self.url}/{number}",
            ) from err
        if self.codecs:
            import numcodecs

            for config in reversed(self.codecs):
                raw = numcodecs.get_codec(dict(config)).decode(raw)
        array = np.frombuffer(bytes(raw), self.dtype)
        if len(array) != self.chunk:
            raise FormatError(
                f"chunk {number} decodes to {len(array)} elements, expected {self.chunk}", url=f"{self.url}/{number}"
            )
        return array[: min(self.chunk, self.length - number * self.chunk)]


class Window:
    """Reads a zarr array forward: slices whose bounds never go back, each chunk fetched once."""

    def __init__(self, array: ZarrArray) -> None:
        self.array = array
        self.start, self.data = 0, np.empty(0, array.dtype)

    def slice(self, start: int, stop: int) -> np.ndarray:
        if start < self.start:
            raise FormatError(
                f"intervals go backwards ({start} after {self.start}): frames must reference consecutive elements",
                url=self.array.url,
            )
        chunk = self.array.chunk
        end = self.start + len(self.data)
        if start >= end:  # drop what is behind, jump to the chunk holding start
            self.start, self.data = (start // chunk) * chunk, np.empty(0, self.array.dtype)
            end = self.start
        else:  # keep only the part from start's chunk on
            keep = (start // chunk) * chunk
            self.data, self.start = self.data[keep - self.start :], keep
        while end < stop:
            self.data = np.concatenate([self.data, self.array.read_chunk(end // chunk)])
            end = self.start + len(self.data)
        return self.data[start - self.start : stop - self.start].copy()


def samples(stores: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[dict]:
    for store in inputs(stores, storage_options):
        arrays = {name: ZarrArray(f"{store}/{name}", storage_options) for name in ARRAYS}
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
