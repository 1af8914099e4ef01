"""A dataset's token counts as a file: a JSON header line naming the key and the dataset's layout, then 4 bytes a
block (the tokens each block holds under the key, blocks numbered shard after shard).

Here, below both, because a writer told to count (`tokens=`) writes it at its commit and a TokenStream reads it
(training/census.py, which bounds and checks what it reads): one format, one name beside the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

COUNTS_FORMAT = "atlas_remote.tokens/1"
SUFFIX = ".tokens"


def counts_url(url: str, key: str = "tokens") -> str:
    """Where a dataset's counts are kept, beside it: `<url>.tokens` (`<url>.<key>.tokens` for another key)."""
    return f"{url.rstrip('/')}{'' if key == 'tokens' else '.' + key}{SUFFIX}"


def encode_counts(key: str, layout_digest: str, blocks: np.ndarray) -> bytes:
    header = {"format": COUNTS_FORMAT, "key": key, "layout": layout_digest, "blocks": len(blocks)}
    return json.dumps(header).encode() + b"\n" + np.asarray(blocks).astype("<u4").tobytes()


def document(example: Any, key: str) -> np.ndarray | str:
    """The token ids of an example (a 1-D integer array under `key`), or what is wrong with it."""
    if not isinstance(example, Mapping):
        return f"is a {type(example).__name__}, not a dict"
    if key not in example:
        shown = ", ".join(repr(k) for k in list(example)[:6])
        return f"has no {key!r} (its keys: {shown})"
    tokens = example[key]
    if type(tokens).__module__ == "torch":
        tokens = tokens.numpy(force=True)
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        kind = f"an array of {tokens.dtype} and shape {tokens.shape}" if isinstance(tokens, np.ndarray) else None
        return f"holds {kind or 'a ' + type(tokens).__name__} under {key!r}, not a 1-D array of integer token ids"
    return tokens
