"""An example as a tree of plain JSON nodes the page draws with `textContent`, never as markup.

Every node is a dict with a `kind`; text from the dataset travels only as JSON strings, so nothing in an
example can become HTML or script. Long text, big containers and arrays are cut here (with their full length
said), so a page of 100 examples stays small whatever they hold. Images are `data:` URLs made only here: bytes
whose first bytes are a PNG, JPEG or WebP signature (passed on as they are: the browser's image decoder reads
them, never a script), or uint8 arrays of image shape, encoded as PNG by `png()`.
"""

from __future__ import annotations

import base64
import math
import struct
import sys
import zlib
from typing import Any

import numpy as np

TEXT_CHARS = 4000  # characters of a string sent (its length is always sent)
ITEMS = 100  # items of a container sent
DEPTH = 8  # containers below this depth are summarised
NUMBERS = 32  # elements of an array sent; 1-D integer arrays (tokens) send TOKENS
TOKENS = 256
IMAGE_BYTES = 8 << 20  # encoded images inlined up to this size
IMAGE_SIDE = 1024  # arrays larger than this on a side are shown subsampled
SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
)


def image_type(data: bytes | bytearray | memoryview) -> str | None:
    """The image type of encoded bytes, from their signature: PNG, JPEG or WebP (never SVG, which is markup)."""
    head = bytes(data[:12])
    for signature, mime in SIGNATURES:
        if head.startswith(signature):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def data_url(mime: str, data: bytes | bytearray | memoryview) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_array(array: np.ndarray) -> np.ndarray | None:
    """A uint8 array as height x width (x 1, 3 or 4 channels), if it has an image's shape: H x W (both at least
    8), H x W x C, or C x H x W as torch keeps images."""
    if array.dtype != np.uint8:
        return None
    if array.ndim == 2 and min(array.shape) >= 8:
        return array
    if array.ndim == 3:
        if array.shape[2] in (1, 3, 4) and min(array.shape[:2]) >= 2:
            return array
        if array.shape[0] in (1, 3, 4) and min(array.shape[1:]) >= 2:
            return np.moveaxis(array, 0, -1)
    return None


def png(image: np.ndarray) -> bytes:
    """A uint8 H x W (x C) array as a PNG file: gray, gray + alpha, RGB or RGBA, 8 bits, no filtering."""
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    color = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = np.ascontiguousarray(image).reshape(height, width * channels)
    raw = np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()  # filter type 0 before each row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


PAGE_BYTES = 64 << 20  # what the nodes of one answer may come to (text, images), NODE_BYTES each beside it
NODE_BYTES = 256


class Page:
    """What the nodes of one answer may still take: values a page shows are cut at TEXT_CHARS, ITEMS and DEPTH,
    yet a value referred to many times is shown each time (100 references to one list of 100 references is
    10,000 nodes); past PAGE_BYTES the rest of the page is said, not shown."""

    def __init__(self, left: int = PAGE_BYTES) -> None:
        self.left = left

    def take(self, size: int) -> bool:
        self.left -= size
        return self.left >= 0


def render(value: Any, depth: int = 0, page: Page | None = None) -> dict[str, Any]:
    """The node of one value (see the module), within what is left of the page's bytes."""
    page = page if page is not None else Page()
    if not page.take(NODE_BYTES):
        return {"kind": "other", "type": _type_name(value), "text": "not shown: the page is full (ask for fewer)"}
    if value is None:
        return {"kind": "none", "text": "None"}
    if isinstance(value, (bool, np.bool_)):
        return {"kind": "bool", "text": str(bool(value))}
    if isinstance(value, (int, np.integer)):
        return {"kind": "int", "text": str(int(value)), "type": _type_name(value)}  # text: no precision lost in JS
    if isinstance(value, (float, np.floating)):
        number = float(value)
        text = repr(number) if math.isfinite(number) else str(number)
        return {"kind": "float", "text": text, "type": _type_name(value)}
    if isinstance(value, str):
        page.take(min(len(value), TEXT_CHARS))
        return {"kind": "str", "text": value[:TEXT_CHARS], "length": len(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes(value, page)
    if isinstance(value, np.ndarray):
        return _array(value, "numpy.ndarray", page)
    tensor = _tensor(value, page)
    if tensor is not None:
        return tensor
    if depth >= DEPTH and isinstance(value, (dict, list, tuple, set, frozenset)):
        return {"kind": "other", "type": type(value).__name__, "text": f"{len(value):,} items (nested too deep)"}
    if isinstance(value, dict):
        pairs: list[list[Any]] = [[key_text(k), render(v, depth + 1, page)] for k, v in _first(value.items())]
        return {"kind": "dict", "type": _type_name(value), "length": len(value), "items": pairs}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [render(v, depth + 1, page) for v in _first(value)]
        return {"kind": "list", "type": _type_name(value), "length": len(value), "items": items}
    return {"kind": "other", "type": _type_name(value), "text": _repr(value)}


def _first(items: Any) -> list:
    out: list[Any] = []
    for item in items:
        if len(out) == ITEMS:
            break
        out.append(item)
    return out


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def key_text(key: Any) -> str:
    """A dict key as the page shows it: a string as it is (cut), anything else as its repr."""
    return key[:TEXT_CHARS] if isinstance(key, str) else _repr(key)


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as err:  # a trusted dataset's own class may fail to print: say so, show the rest
        text = f"<{_type_name(value)}: repr failed: {type(err).__name__}>"
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"


def _bytes(value: bytes | bytearray | memoryview, page: Page) -> dict[str, Any]:
    data = bytes(value[:64])
    node: dict[str, Any] = {"kind": "bytes", "length": len(value), "text": repr(data)[2:-1]}
    mime = image_type(data)
    if mime is not None:
        node["mime"] = mime
        if len(value) <= IMAGE_BYTES and page.take(len(value) * 4 // 3):
            node["image"] = data_url(mime, value)
    return node


def _array(array: np.ndarray, type_name: str, page: Page) -> dict[str, Any]:
    node: dict[str, Any] = {
        "kind": "array",
        "type": type_name,
        "dtype": str(array.dtype),
        "shape": list(array.shape),
        "size": int(array.size),
    }
    image = image_array(array)
    if image is not None and page.take(min(image.nbytes, IMAGE_SIDE * IMAGE_SIDE * 4)):
        step = max(1, -(-max(image.shape[:2]) // IMAGE_SIDE))
        node["image"] = data_url("image/png", png(image[::step, ::step]))
        node["subsampled"] = step
        return node
    tokens = array.ndim == 1 and array.dtype.kind in "iu"
    node["tokens"] = tokens
    flat = array.flat[: TOKENS if tokens else NUMBERS]  # a copy of those only (reshape copies a view whole)
    try:
        node["values"] = [_element(v) for v in flat.tolist()]
    except Exception:  # a record dtype of odd fields: its repr says enough
        node["values"] = [_repr(flat)]
    return node


def _element(value: Any) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, str)):
        return repr(value)[:200]
    return str(value)[:200]


def _tensor(value: Any, page: Page) -> dict[str, Any] | None:
    """A torch tensor as an array (torch is only looked at if a block already loaded it)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    try:
        array = value.detach().cpu().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and friends have no numpy dtype
        array = value.detach().cpu().float().numpy()
    node = _array(array, "torch.Tensor", page)
    node["dtype"] = str(value.dtype).removeprefix("torch.")
    return node
