"""How many tokens each block of a dataset holds under one key: what packing documents into sequences must
know before it reads them.

A packed epoch is a number of sequences, and every rank must yield the same number of batches of them, resumed
at any topology from a count of batches: so the sequences each run of blocks gives are counted from these
numbers, never from the data being read (docs/training.md, "Language models"). One pass over the dataset counts
them (`TokenCounts.of`); `save` and `load` keep them at any URL, 4 bytes a block, so a job counts once and every
rank and worker loads them. A file of counts is data from whoever wrote it: `load` bounds it by the dataset's
own layout before reading it, and a stream checks every block it packs against it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PackingError
from ..format.codec import DEFAULT_MAX_BLOCK_BYTES
from ..format.spec import Layout
from ..format.token_counts import COUNTS_FORMAT, document, encode_counts

MAX_HEADER = 4096
CHUNK = 1 << 16  # examples counted per step of the pass
# What a stored byte decompresses to at most: a zstd block of 4 bytes (an RLE block) makes 128 KiB, and 256 MiB of
# zeros compress 32,692 to 1 at every level. A token is at least one byte of its block.
ZSTD_MOST = 1 << 15


def blocks_of(layout: Layout) -> np.ndarray:
    """Blocks of each shard."""
    return -(-layout.sizes // layout.block_sizes)


def block_ids(layout: Layout, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard position, block of the dataset) of each example: blocks numbered shard after shard."""
    ends = np.cumsum(layout.sizes)
    shard = np.searchsorted(ends, examples, side="right")
    first_block = np.cumsum(blocks_of(layout)) - blocks_of(layout)
    return shard, first_block[shard] + (examples - (ends[shard] - layout.sizes[shard])) // layout.block_sizes[shard]


def where(dataset: Any, layout: Layout, example: int) -> dict[str, Any]:
    """The dataset, shard and block of an example, as an error names them."""
    shard, block = (int(x[0]) for x in block_ids(layout, np.array([example])))
    shards = getattr(dataset, "shards", None)
    first = int((np.cumsum(blocks_of(layout)) - blocks_of(layout))[shard])
    name = getattr(shards[shard], "name", str(shard)) if shards is not None else str(shard)
    return {"url": getattr(dataset, "url", None), "shard": name, "block": block - first}


def refuse(dataset: Any, layout: Layout, example: int, problem: str) -> PackingError:
    return PackingError(
        f"example {example} {problem}: a TokenStream packs examples holding a 1-D array of integer token ids "
        f"(give key= for another key, or map= the dataset into that form)",
        **where(dataset, layout, example),
    )


@dataclass(frozen=True, eq=False)
class TokenCounts:
    """Tokens in each block of one dataset under `key` (blocks numbered shard after shard), for the dataset
    whose layout digest is `layout`."""

    key: str
    layout: str
    blocks: np.ndarray  # uint32, one per block

    @classmethod
    def of(cls, dataset: Any, key: str = "tokens") -> TokenCounts:
        """Count them: one pass over the dataset, in order, with its read-ahead (the reading of one epoch); none
        over a source that knows them (a Megatron corpus, from its .idx: `tokens_per_block`)."""
        layout = dataset.layout()
        if hasattr(dataset, "tokens_per_block"):
            return cls(key, layout.digest(), dataset.tokens_per_block(key))
        counts = np.zeros(int(blocks_of(layout).sum()), dtype=np.int64)
        examples = iter(dataset.iter(0, len(layout)))
        for start in range(0, len(layout), CHUNK):
            stop = min(start + CHUNK, len(layout))
            lengths = np.empty(stop - start, dtype=np.int64)
            for k in range(stop - start):
                tokens = document(next(examples), key)
                if isinstance(tokens, str):
                    raise refuse(dataset, layout, start + k, tokens)
                lengths[k] = len(tokens)
            np.add.at(counts, block_ids(layout, np.arange(start, stop))[1], lengths)
        if len(counts) and counts.max() >= 1 << 32:
            raise PackingError(f"a block of {int(counts.max()):,} tokens: blocks of fewer than 2^32 are counted")
        return cls(key, layout.digest(), counts.astype(np.uint32))

    def digest(self) -> str:
        return hashlib.sha256(self.key.encode() + b"/" + self.blocks.astype("<u4").tobytes()).hexdigest()[:16]

    def to_bytes(self) -> bytes:
        return encode_counts(self.key, self.layout, self.blocks)

    def save(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        """Write them at any fsspec URL (one object)."""
        import fsspec

        with fsspec.open(url, "wb", **(storage_options or {})) as f:
            f.write(self.to_bytes())

    @classmethod
    def load(
        cls, url: str, dataset: Any, key: str = "tokens", storage_options: dict[str, Any] | None = None
    ) -> TokenCounts:
        """Read counts saved for this dataset (or its layout): never more bytes than its blocks need, and
        refused (PackingError) if they were saved for another dataset or key, or are not counts at all."""
        layout = dataset if isinstance(dataset, Layout) else dataset.layout()
        blocks = int(blocks_of(layout).sum())
        limit = MAX_HEADER + 1 + 4 * blocks
        try:
            raw = _read_head(url, limit + 1, storage_options)
        except FileNotFoundError as err:  # fsspec's names the path without its scheme
            raise PackingError(
                f"no token counts here: count them once, TokenCounts.of(dataset).save(url), or write the dataset "
                f"with tokens={key!r} (convert --tokens {key}), which saves them beside it",
                url=url,
            ) from err
        counts = cls.from_bytes(raw, layout, key, url)
        if not isinstance(dataset, Layout):
            counts.check_claims(dataset, url)
        return counts

    @classmethod
    def from_bytes(cls, raw: bytes, layout: Layout, key: str, url: str = "") -> TokenCounts:
        blocks = int(blocks_of(layout).sum())
        again = "count them again: TokenCounts.of(dataset, key).save(url)"
        head, newline, body = raw[: MAX_HEADER + 1].partition(b"\n")
        if not newline:
            raise PackingError(f"not token counts (no header in the first {MAX_HEADER} bytes): {again}", url=url)
        try:
            header = json.loads(head)
        except (ValueError, RecursionError):
            raise PackingError(f"not token counts (the header is not JSON): {again}", url=url) from None
        expected = {"format": COUNTS_FORMAT, "key": key, "layout": layout.digest(), "blocks": blocks}
        if not isinstance(header, dict) or header != expected:
            got = {k: header.get(k) for k in expected} if isinstance(header, dict) else type(header).__name__
            raise PackingError(f"token counts for another dataset or key ({str(got)[:200]}): {again}", url=url)
        body = raw[len(head) + 1 :]
        if len(body) != 4 * blocks:
            raise PackingError(
                f"{len(body):,} bytes of counts where {blocks:,} blocks need {4 * blocks:,}: {again}", url=url
            )
        counts = cls(key, layout.digest(), np.frombuffer(body, dtype="<u4").astype(np.uint32))
        counts.check_claims(layout, url)
        return counts

    def check_claims(self, dataset: Any, url: str = "") -> None:
        """Counts no block could hold are refused before a stream plans from them (a forged file of 4e9 tokens a
        block took 27 s and 5 GB to plan its first batch): a block holds at most max_block_bytes tokens (each is
        a byte at least of its decompressed block), and, where the dataset's manifest gives each shard's data.bin
        size, a shard at most ZSTD_MOST tokens a stored byte. Counts within that and still forged are refused
        by the first block a stream packs (PackingError)."""
        layout = dataset if isinstance(dataset, Layout) else dataset.layout()
        most = getattr(getattr(dataset, "options", None), "max_block_bytes", DEFAULT_MAX_BLOCK_BYTES)
        again = "count them again: TokenCounts.of(dataset, key).save(url)"
        if len(self.blocks) and int(self.blocks.max()) > most:
            block = int(np.argmax(self.blocks))
            raise PackingError(
                f"{int(self.blocks[block]):,} tokens claimed for block {block} of the dataset, more than a block "
                f"can hold (max_block_bytes {most:,}): {again}",
                url=url,
            )
        manifest = getattr(dataset, "manifest", None)
        table = getattr(dataset, "table", None)
        if manifest is None or table is None or not manifest.lists(table.numbers) or not len(self.blocks):
            return
        stored = manifest.data_bytes[np.searchsorted(manifest.numbers, table.numbers)]
        per_shard = blocks_of(layout)
        starts = np.cumsum(per_shard) - per_shard
        claimed = np.add.reduceat(self.blocks.astype(np.int64), np.minimum(starts, len(self.blocks) - 1))
        claimed[per_shard == 0] = 0
        over = np.flatnonzero(claimed > ZSTD_MOST * stored)
        if len(over):
            shard = int(over[0])
            raise PackingError(
                f"{int(claimed[shard]):,} tokens claimed for the {int(stored[shard]):,} stored bytes of shard "
                f"{dataset.shards[shard].name}, more than zstd can decompress them to ({ZSTD_MOST:,} a byte): "
                f"{again}",
                url=url,
            )


def _read_head(url: str, nbytes: int, storage_options: dict[str, Any] | None) -> bytes:
    """The first nbytes of the object at url: through the client the dataset reads with where obstore serves
    the URL (one request; s3fs and botocore, a second of CPU and imports in a training process, never loaded),
    else, or where that read fails (fsspec then names the failure), through fsspec."""
    from ..storage.connect import OBSTORE_READS
    from ..storage.store import Store

    parent, _, name = url.rstrip("/").rpartition("/")
    if url.split("://", 1)[0] in OBSTORE_READS and "://" in parent and "::" not in url:
        with Store(parent, storage_options) as store:
            if store.read_client == "obstore":
                head = store.read_head(name, nbytes, "counts")
                if head:
                    return bytes(head)
    import fsspec

    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        return bytes(f.read(nbytes))
