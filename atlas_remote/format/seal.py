"""What a signature binds: a shard's every input to what its blocks decode to, and its place in its dataset.

A block decodes to what its stored bytes, the dictionary and the shard's settings make together, so a seal over
the blocks alone let a forged `zstd_dict.bin` change (or crash) what signed blocks decoded to (issue 45, row 1).
A shard's *content digest* is SHA-256 over, in order and at fixed lengths: the shard's settings that decide
decoding and counting (format version, block size, examples, compression strategy), the SHA-256 of the
dictionary its blocks are decompressed with (shared or its own; zeros for none), its block offsets, and each
stored block's SHA-256 (atlas_blocks.npy records them). A writer seals the *placed statement*: the content digest
with the dataset's identity and the shard's number. The identity (32 bytes, in the manifest) is a digest of every
sealed shard's number and content digest: two datasets share it only if every shard of one is the other's, at the
same number (moving a shard between them changes nothing), and a dataset written twice from the same examples is
the same bytes twice. A reader checks one seal when it opens a shard, and a block's SHA-256 against the recorded
one when it reads it.

Workers of a write do not know the number a shard will get (shards are numbered at commit), so they seal a
*staged statement* (the content digest and the folder the shard is staged in), and the committer checks it
before it seals the placed one: it never vouches for a staged file someone else could have written.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import numpy as np

from .spec import AtlasDatasetShardMetadata

DIGEST_BYTES = 32
DATASET_ID_BYTES = 32  # a digest whole: two example sets made to collide in 16 bytes cost 2^64, not 2^128
NO_DICTIONARY = bytes(DIGEST_BYTES)
_CONTENT = b"atlas_remote shard content/2\0"
_PLACED = b"atlas_remote placed shard/2\0"
_STAGED = b"atlas_remote staged shard/2\0"
_DATASET = b"atlas_remote dataset/2\0"


def block_digest(stored: bytes | memoryview) -> bytes:
    return hashlib.sha256(stored).digest()


def block_digests(stored: Iterable[bytes | memoryview]) -> bytes:
    """The blocks' digests, end to end."""
    return b"".join(map(block_digest, stored))


def dictionary_digest(dictionary: bytes | None) -> bytes:
    return hashlib.sha256(dictionary).digest() if dictionary is not None else NO_DICTIONARY


def content_digest(meta: AtlasDatasetShardMetadata, dictionary: bytes, offsets: np.ndarray, digests: bytes) -> bytes:
    """The shard's content digest (above): `dictionary` is the dictionary's digest, `digests` the blocks'."""
    content = hashlib.sha256(_CONTENT)
    settings = (meta.version, meta.block_size, meta.stored_examples, int(meta.compression_strategy))
    content.update(struct.pack("<qqqq", *settings))
    content.update(dictionary)
    content.update(np.ascontiguousarray(offsets, dtype="<u8").tobytes())
    content.update(digests)
    return content.digest()


def dataset_identity(contents: dict[int, bytes]) -> bytes:
    """The identity of a dataset whose sealed shards have these content digests, by number."""
    identity = hashlib.sha256(_DATASET)
    for number in sorted(contents):
        identity.update(struct.pack("<q", number) + contents[number])
    return identity.digest()[:DATASET_ID_BYTES]


def placed(dataset: bytes, shard: int, content: bytes) -> bytes:
    """What a dataset's signer seals for shard number `shard` of dataset `dataset`."""
    return _PLACED + dataset + struct.pack("<q", shard) + content


def staged(folder: str, content: bytes) -> bytes:
    """What a worker seals for a shard staged at `folder` (a path within the dataset's URL)."""
    return _STAGED + hashlib.sha256(folder.encode()).digest() + content
