"""Integrity and upkeep: verify(url) reads every block and reports every problem; add_checksums(url) gives every
shard not yet signed with the user's key (every dataset of the original writer, a stranger's, one written
unsigned) its atlas_blocks.npy and, in the manifest, its seal; add_manifest(url) gives any dataset its manifest
(keeping the seals it had)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import AtlasError, CorruptBlockError, FormatError, UnsafePickleError
from ..format.manifest import MANIFEST, Manifest, Seals, shard_digest
from ..format.seal import block_digest, content_digest, dataset_identity, placed
from ..format.spec import BLOCKS_FILE, ROOT_META, encode_blocks, shard_name
from ..read.discovery import find_shards
from ..read.options import ReaderOptions
from ..read.reader import AtlasDataset
from ..read.shard_fetch import OpenShard, signer_of
from ..read.shards import Shard, ShardTable
from ..runtime.progress import ProgressArgument, progress_bar
from ..trust.keys import Signer, Trust, writer_signer
from .commit import take_lease
from .lease import Lease

NO_CHECKSUMS = (
    "without checksums a flipped bit can decode to wrong examples with no error; `atlas-remote checksum URL` adds them"
)


REFUSED = "refused: "  # marks a refused global among the problems while blocks are checked


@dataclass
class VerifyReport:
    url: str
    shards_checked: int = 0
    blocks_checked: int = 0
    examples_checked: int = 0
    blocks_with_checksums: int = 0
    blocks_signed: int = 0  # sealed with a key the reader trusts: checked against their signed digests
    signers: set[str] = field(default_factory=set)  # how those keys are named ("your key", "a key you trust")
    missing_shards: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # blocks naming classes the unpickler refuses: not damage

    @property
    def ok(self) -> bool:
        return not self.problems and not self.refused

    def __str__(self) -> str:
        state = "OK" if self.ok else f"{len(self.problems)} problem(s)" if self.problems else "not decoded"
        lines = [
            f"{self.url}: {state} - {self.shards_checked} shards, "
            f"{self.blocks_checked} blocks ({self.blocks_with_checksums} with checksums, {self.blocks_signed} signed "
            f"with {' and '.join(sorted(self.signers)) or 'your key'}), "
            f"{self.examples_checked} examples decoded"
        ]
        unchecked = self.blocks_checked - self.blocks_with_checksums
        if unchecked:
            lines.append(
                f"{unchecked} blocks have no checksums: they were checked only for decoding and example "
                f"counts; {NO_CHECKSUMS}"
            )
        if self.missing_shards:
            lines.append(f"shards not present (not counted as problems): {self.missing_shards}")
        if self.refused:
            lines.append(
                f"{len(self.refused)} block(s) hold classes the restricted unpickler refuses, which is not damage: "
                f"allow them (--allow-class MODULE.NAME, or allowed_classes=) or trust the dataset (--trusted); "
                f"first: {self.refused[0]}"
            )
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def _blocks_of(ds: AtlasDataset, shard: Shard, problems: list[str]) -> Iterator[tuple[bytes | memoryview, list]]:
    """(raw bytes, examples) of every block of a shard that decodes; the others go to problems."""
    for _, raw, examples in ds.shard_blocks(shard):
        if isinstance(examples, UnsafePickleError):
            problems.append(REFUSED + str(examples))
        elif isinstance(examples, AtlasError):
            problems.append(str(examples))
        else:
            yield raw, examples


def _open_shards(ds: AtlasDataset, problems: list[str]) -> Iterator[Shard]:
    for shard in ds.shards:
        try:
            ds.open_shard(shard)
        except AtlasError as err:
            problems.append(str(err))
            continue
        yield shard


def verify(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    options: ReaderOptions | None = None,
    progress: ProgressArgument = None,
    **settings: Any,
) -> VerifyReport:
    """Open every shard and decode every block, checking sizes, checksums and example counts.

    Blocks are decoded as a reader with these options (or settings) would decode them, with its pickle policy.
    `progress`: a bar where someone is looking (None), always (True), never (False), or a function told
    (examples, bytes) after each block.
    """
    ds = AtlasDataset(url, storage_options, options=ReaderOptions.of(options, **settings).replace(cache_bytes=0))
    report = VerifyReport(url)
    present = {s.number for s in ds.shards}
    report.missing_shards = [n for n in range(len(ds.metadata.shard_sizes)) if n not in present]
    with progress_bar(progress, len(ds), "verify") as tell:
        for shard in _open_shards(ds, report.problems):
            report.shards_checked += 1
            report.blocks_checked += shard.known_meta.num_blocks
            if shard.checksums is not None:
                report.blocks_with_checksums += shard.known_meta.num_blocks
            if shard.opened is not None and shard.opened.signer is not None:
                report.blocks_signed += shard.known_meta.num_blocks
                report.signers.add(ds.table.trust.name(shard.opened.signer))
            for raw, examples in _blocks_of(ds, shard, report.problems):
                report.examples_checked += len(examples)
                tell(len(examples), len(raw))
    report.refused = [p[len(REFUSED) :] for p in report.problems if p.startswith(REFUSED)]
    report.problems = [p for p in report.problems if not p.startswith(REFUSED)]
    return report


@dataclass
class ChecksumReport:
    url: str
    shards_added: list[str] = field(default_factory=list)
    shards_already: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    signed: bool = True  # False: there was no key to sign with (keys.py), so checksums only
    signer: str | None = None  # the id of the key it signed with

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        added = "checksums and signatures" if self.signed else "checksums (no key to sign with)"
        lines = [
            f"{self.url}: {added} added to {len(self.shards_added)} shards, "
            f"{len(self.shards_already)} already signed with your key"
        ]
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s): shards with a bad block got none")
            lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def add_checksums(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    options: ReaderOptions | None = None,
    progress: ProgressArgument = None,
    sign_with: str | None = None,
    **settings: Any,
) -> ChecksumReport:
    """Give every shard not yet signed with your key its atlas_blocks.npy (each block's CRC-32 and SHA-256), and
    the dataset a manifest sealing each shard with your key (format/seal.py),
    leaving every other byte as it is: the shards then read as your own. `sign_with`: "private" (your Ed25519
    key) or "secret" (your secret key); by default the private key if you have one (keys.py).

    Each block is decoded first, as a stranger's block is (the reader's pickle policy, every check on what it
    builds), even where another key you trust signed it, or your seal no longer matches (a shard changed or moved
    since: `verify` names them): a seal vouches for what a block holds now, so a shard with a block that does not
    pass gets none, and is reported. Holds the URL's writer lease. `progress` as in verify().
    """
    ds = AtlasDataset(url, storage_options, options=ReaderOptions.of(options, **settings).replace(cache_bytes=0))
    signer = writer_signer(sign_with)
    ds.table.trust = Trust()  # every shard opened as a stranger's; whose seal is still this key's, below
    report = ChecksumReport(url, signed=signer is not None, signer=signer.id if signer is not None else None)
    contents: dict[int, bytes] = {}  # each signed shard's content digest, by number
    lease = take_lease(ds.store, "atlas-remote checksum")
    try:
        with progress_bar(progress, len(ds), "checksum") as tell:
            for shard in _open_shards(ds, report.problems):
                opened = shard.opened
                assert opened is not None  # _open_shards opened it
                if _sealed_by(signer, ds, shard) or (signer is None and shard.checksums is not None):
                    if opened.sums is not None and opened.sums.digests is not None:
                        contents[shard.number] = _content(opened, opened.sums.digests)
                    report.shards_already.append(shard.name)
                    tell(len(shard), 0)
                    continue
                problems: list[str] = []
                crc32, digests = [], []
                for raw, examples in _blocks_of(ds, shard, problems):
                    crc32.append(zlib.crc32(raw))
                    digests.append(block_digest(raw))
                    tell(len(examples), len(raw))
                if problems:
                    report.problems += [p.removeprefix(REFUSED) for p in problems]
                    continue
                offsets = [int(n) for n in cast(Any, shard.offsets)]
                sidecar = encode_blocks(offsets, crc32, b"".join(digests), opened.decoder.dictionary_digest)
                lease.check()
                ds.store.write(shard.file(BLOCKS_FILE), sidecar)
                contents[shard.number] = _content(opened, b"".join(digests))
                report.shards_added.append(shard.name)
        if report.shards_added and (signer is not None or ds.manifest is not None):
            _write_manifest(ds, lease, _seals(signer, contents) if signer is not None else None)
    finally:
        lease.release()
    return report


def _sealed_by(signer: Signer | None, ds: AtlasDataset, shard: Shard) -> bool:
    """Whether the shard passes a seal of this signer's in the dataset's manifest."""
    opened, manifest = shard.opened, ds.manifest
    if signer is None or opened is None or manifest is None:
        return False
    row = manifest.entry(shard.number)
    try:
        found = signer_of(
            Trust.of(signer), manifest, row, shard.number, opened.meta, opened.offsets, opened.sums, opened.decoder, ""
        )
    except CorruptBlockError:
        return False
    return found == signer.id


def _content(opened: OpenShard, digests: bytes) -> bytes:
    return content_digest(opened.meta, opened.decoder.dictionary_digest, opened.offsets, digests)


def _seals(signer: Signer, contents: dict[int, bytes]) -> Seals:
    """Each shard's seal, under the identity its shards make (format/seal.py; never the one a manifest from the
    bucket names: a copy of one of your datasets would then share its identity)."""
    dataset = dataset_identity(contents)
    return Seals(dataset, signer.id, {n: signer.sign(placed(dataset, n, c)) for n, c in contents.items()})


@dataclass
class IndexReport:
    url: str
    shards: int
    bytes: int

    def __str__(self) -> str:
        return (
            f"{self.url}: manifest written ({self.shards} shards, {self.bytes:,} bytes); readers now open it in "
            f"a few requests whatever its number of shards"
        )


def add_manifest(url: str, storage_options: dict[str, Any] | None = None, **settings: Any) -> IndexReport:
    """Write the dataset's manifest (manifest.py) from its shards' own meta.json files and data.bin sizes: for a
    dataset written by another tool, or whose manifest is stale. Every other byte stays as it is; holds the URL's
    writer lease. Shards are listed as present now (a partial dataset's manifest lists the shards it has)."""
    ds = AtlasDataset(url, storage_options, **settings)
    ds.store.require_writable()
    lease = take_lease(ds.store, "atlas-remote index")
    try:
        return _write_manifest(ds, lease)
    finally:
        lease.release()


def _write_manifest(ds: AtlasDataset, lease: Lease, seals: Seals | None = None) -> IndexReport:
    """The manifest of the shard folders present now (not an older manifest's list), from their own files, with
    `seals`, or else the seals of the manifest it replaces (each still checked by readers)."""
    store, url = ds.store, ds.url
    present = find_shards(store, ds.metadata)
    table = ShardTable(store, ds.metadata, present, ds.policy, options=ds.options)
    count = len(ds.metadata.shard_sizes)
    odd = [s.name for s in table.shards if s.name != shard_name(s.number, count)]
    if odd:
        raise FormatError(
            f"shard folders {odd[:3]} are not named as the format names them (zero-padded to "
            f"{len(shard_name(count - 1, count))} digits): the manifest could not name them",
            url=url,
        )

    def row(shard: Shard) -> tuple:
        opened = table.open(shard)
        digest = shard_digest(opened.offsets, opened.sums)
        return shard.number, opened.meta, opened.identity.size, opened.sidecar, digest

    with ThreadPoolExecutor(32, thread_name_prefix="atlas-index") as pool:
        rows = list(pool.map(row, table.shards))
    old = ds.manifest
    if seals is None and old is not None and old.dataset is not None and old.signer is not None:
        kept = {int(n): old.seal(row) for row, n in enumerate(old.numbers.tolist())}
        seals = Seals(old.dataset, old.signer, {n: seal for n, seal in kept.items() if seal is not None})
    manifest = Manifest.of(store.read(ROOT_META, "meta"), rows, seals).encode()
    lease.check()
    store.write(MANIFEST, manifest)
    return IndexReport(url, len(table.shards), len(manifest))
