"""Writing an Atlas dataset to any fsspec URL, atomically, one writer per URL: the write pipeline's start and end
(parts.StagedParts) around one part written in this process (part_writer.PartWriter).

The writer first takes the URL's lease (see lease.py): that also proves the bucket exists and is writable,
before any shard is built. Each shard is built in a local temporary folder, then finished (its last blocks
compressed, its dictionary trained where it has one) and uploaded to a staging prefix inside the dataset URL in
the background while the next shard fills, and deleted locally: local disk holds at most two shards. `close()`
commits (see commit.py): the URL serves the old dataset until the new one is complete, then the new one, never a
mix. A writer that fails before its commit, or leaves its `with` block by an exception, discards everything it
staged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from ..format.spec import VERSION, CompressionStrategy
from ..storage import location
from .lease import DEFAULT_LEASE_SECONDS
from .parts import StagedParts
from .settings import WriteSettings
from .shard_writer import CloseOrDiscard

log = logging.getLogger(__name__)


class AtlasDatasetWriter(CloseOrDiscard):
    """Writes an Atlas v1 dataset to a local path or any fsspec URL; the dataset appears only when committed.

    Use it as a context manager: leaving the block normally commits, leaving it by an exception discards.
    With checksums=True (the default) each shard folder also gets atlas_blocks.npy, a CRC-32 and a signature
    with the user's key per block that readers verify (keys.py), and the root gets atlas_manifest.npz, every
    shard's metadata in one object so that opening costs two requests however many shards there are; the
    original reader ignores both. checksums=False writes exactly the original writer's files.
    Writing to a URL that already holds a committed dataset is refused unless overwrite=True; with
    overwrite=True the old dataset stays readable until the new one is complete, and files beside it that are
    not Atlas files are kept. Only one writer at a time may write to a URL: a second one gets DatasetLockedError.
    The location is the first argument; `path=` (the original's name) is accepted for it too. `shard_size` and
    `block_size` default as `convert`'s do (10,000 and 64). `tokens="tokens"` counts each block's tokens under
    that key as they are written and saves them beside the dataset at its commit (`<url>.tokens`), where a
    TokenStream finds them: no counting pass.
    """

    VERSION = VERSION

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        shard_size: int = 10_000,
        block_size: int = 64,
        compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict_size: float = 0.01,
        storage_options: dict[str, Any] | None = None,
        *,
        path: str | os.PathLike | None = None,
        overwrite: bool = False,
        checksums: bool = True,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        tokens: str | None = None,
    ) -> None:
        self.settings = WriteSettings(
            shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums, tokens
        )
        self.url = location(url=url, path=path)
        self.overwrite = overwrite
        self._closed = True  # until the lease is ours: discard() then has nothing to undo
        self._staged = StagedParts(
            self.url,
            self.settings,
            storage_options,
            holder="AtlasDatasetWriter",
            overwrite=overwrite,
            lease_seconds=lease_seconds,
        )
        self._part = self._staged.spec(0).writer(self._staged.store)
        self._closed = False

    def __len__(self) -> int:
        return len(self._part)

    def add_example(self, example: Any) -> None:
        """Add one example. One that cannot be pickled is refused when its block is pickled, by this call, a later
        one or close(), with UnpicklableExampleError naming it; the others are kept and the writer goes on."""
        self._part.add_example(example)

    def add_examples(self, examples: Iterable[Any]) -> None:
        """add_example for each, without a Python call per example (see PartWriter.add_examples)."""
        self._part.add_examples(examples)

    def close(self) -> None:
        """Finish the last shard, upload it, and commit the dataset (see commit.py for the guarantee).

        Unpicklable examples of the last block are refused first (UnpicklableExampleError, the writer still open:
        close() again commits the others). A failure after that and before the commit's point of no return
        discards what was staged and leaves the URL as it was; a failure after it raises CommitInterruptedError,
        and `recover(url)` (or the next writer) finishes it.
        """
        if self._closed:
            return
        self._part.pickle_pending()
        try:
            part = self._part.close()
        except BaseException:
            self.discard()
            raise
        self._closed = True
        meta = self._staged.commit([part], keep_staged=False)
        log.info("committed %s: %d examples in %d shards", self.url, sum(meta.shard_sizes), len(meta.shard_sizes))

    def discard(self) -> None:
        """Abandon the dataset being written: nothing is committed, staged uploads are deleted."""
        if self._closed:
            return
        self._closed = True
        self._part.abandon()
        self._staged.discard()
