"""Copying a dataset between any two URLs, committed at the destination exactly as the writer commits.

Shards are copied in parallel into the destination's staging folder, then committed (the write pipeline's start
and end, parts.StagedParts: lease, journal, root meta.json last), so a reader at the destination sees the old dataset or the whole copy. Where
both ends are one filesystem (same store, same credentials), objects are copied server-side and no data passes
through this process. Otherwise data.bin is streamed in block-aligned chunks, and every block is checked
against the source's checksums, if it has them, before it is written.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from ..errors import AtlasError, CorruptBlockError
from ..format.manifest import MANIFEST
from ..format.names import is_atlas_file
from ..format.spec import CHECKSUM_FILE, DATA_FILE, DICT_FILE, INDEX_FILE, ROOT_META
from ..read.readahead import plan_windows
from ..read.reader import AtlasDataset
from ..read.shards import Shard
from ..runtime.progress import ProgressArgument, progress_bar
from ..storage.ranges import ByteRange
from .commit import CommitPlan
from .parts import StagedParts

CHUNK_BYTES = 8 * 1024 * 1024
KINDS = {INDEX_FILE: "index", CHECKSUM_FILE: "checksums", DICT_FILE: "dict", MANIFEST: "manifest"}  # for their bound
Progress = Callable[[int, int], None]  # (examples, bytes) done since the last call


@dataclass
class CopyReport:
    src: str
    dest: str
    shards: int
    files: int
    bytes: int
    server_side: bool
    blocks_verified: int

    def __str__(self) -> str:
        how = (
            "server-side copies"
            if self.server_side
            else f"streamed, {self.blocks_verified} blocks checked against their checksums"
        )
        return (
            f"copied {self.src} -> {self.dest}: {self.shards} shards, {self.files} files, {self.bytes:,} bytes ({how})"
        )


def copy_dataset(
    src: str,
    dest: str,
    *,
    src_options: dict[str, Any] | None = None,
    dest_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    workers: int = 8,
    progress: ProgressArgument = None,
) -> CopyReport:
    """Copy the dataset at src to dest (the shards present at src, and its root meta.json as it is). `progress`:
    a bar where someone is looking (None), always (True), never (False), or a function told (examples, bytes)."""
    source = AtlasDataset(src, src_options, cache_bytes=0, readahead=0)
    with progress_bar(progress, len(source), "cp") as tell:
        return _copy(source, src, dest, dest_options, overwrite, workers, tell)


def _copy(
    source: AtlasDataset,
    src: str,
    dest: str,
    dest_options: dict[str, Any] | None,
    overwrite: bool,
    workers: int,
    progress: Progress | None,
) -> CopyReport:
    sizes = source.store.find()
    root_meta = source.store.read(ROOT_META, "meta")
    staged = StagedParts(dest, None, dest_options, holder="atlas-remote cp", overwrite=overwrite)
    target, staging = staged.store, staged.staging
    server_side = target.same_namespace(source.store)
    shard_files: list[list[str]] = [[] for _ in source.metadata.shard_sizes]
    for rel in sizes:
        folder, _, name = rel.partition("/")
        shard = next((s for s in source.shards if s.name == folder), None)
        if shard is not None and is_atlas_file(rel):
            shard_files[shard.number].append(name)
    shared_dict = DICT_FILE in sizes

    def copy_file(rel: str, staged: str) -> None:
        if server_side:
            target.copy_from(source.store, rel, staged)
        else:
            target.write(staged, source.store.read(rel, KINDS.get(rel.rsplit("/", 1)[-1], "meta")))
        if progress:
            progress(0, sizes[rel])

    def copy_shard(shard: Shard) -> int:
        verified = 0
        for name in shard_files[shard.number]:
            staged = f"{staging}/{shard.number}/{name}"
            if name == DATA_FILE and not server_side:
                chunks = _verified_chunks(source, shard, progress)
                target.write_stream(staged, chunks)
                meta = shard.meta  # the shard was opened to stream it
                verified += meta.num_blocks if meta is not None and shard.checksums is not None else 0
            else:
                copy_file(shard.file(name), staged)
                if name == DATA_FILE and progress:
                    progress(len(shard), 0)
        return verified

    manifest = source.manifest is not None and len(source.manifest) == len(source.shards)
    try:
        if shared_dict:
            copy_file(DICT_FILE, f"{staging}/{DICT_FILE}")
        if manifest:  # written for this root meta.json, which is copied as it is
            copy_file(MANIFEST, f"{staging}/{MANIFEST}")
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="atlas-cp") as pool:
            verified = sum(pool.map(copy_shard, source.shards))
    except BaseException:
        staged.discard()
        raise
    plan = CommitPlan(staged.token, shard_files, shared_dict, root_meta, manifest=manifest)
    staged.finish(plan, keep_staged=False)
    copied = [DICT_FILE] * shared_dict + [s.file(n) for s in source.shards for n in shard_files[s.number]]
    return CopyReport(
        src,
        dest,
        len(source.shards),
        len(copied) + 1,
        sum(sizes[r] for r in copied) + len(root_meta),
        server_side,
        verified,
    )


def _verified_chunks(source: AtlasDataset, shard: Shard, progress: Progress | None) -> Iterator[bytes | memoryview]:
    """data.bin in chunks of whole blocks (about CHUNK_BYTES each), every block checked against its checksum."""
    source.open_shard(shard)
    meta = shard.meta
    assert meta is not None  # open_shard read it
    offsets, checksums, block_size = cast(Any, shard.offsets), shard.checksums, meta.block_size
    for window in plan_windows(offsets, block_size, 0, len(shard), CHUNK_BYTES):
        block, last = window.block, window.stop_block - 1
        start = int(offsets[block])
        span = ByteRange(shard.file(DATA_FILE), start, int(offsets[last + 1]))
        try:
            data = source.store.read_ranges([span], "block")[span]
        except AtlasError as err:
            raise err.located(url=source.url, shard=shard.name, block=block)
        if checksums is not None:
            for b in range(block, last + 1):
                piece = data[int(offsets[b]) - start : int(offsets[b + 1]) - start]
                if zlib.crc32(piece) != int(checksums[b]):
                    raise CorruptBlockError(
                        f"checksum mismatch (CRC-32 {zlib.crc32(piece):08x}, recorded {int(checksums[b]):08x}); "
                        f"nothing was committed at the destination",
                        url=source.url,
                        path=span.path,
                        shard=shard.name,
                        block=b,
                        byte_range=(int(offsets[b]), int(offsets[b + 1])),
                    )
        if progress:
            progress(min((last + 1) * block_size, len(shard)) - block * block_size, len(data))
        yield data
