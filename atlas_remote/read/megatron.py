"""A Megatron corpus read where it lies: `atlas_remote.megatron(prefix)` over one or several `prefix.idx` +
`prefix.bin` pairs on any URL the library reads, a source of documents of token ids that `TokenStream`, a
`Mixture` and `ShuffledStream` take as they take an Atlas dataset (docs/training.md, "A Megatron corpus in place").

Each .idx is read once, whole (its first MiB, then the rest in one ranged read: two requests a file beside the
.bin's size, every file at once), and checked as the importer checks it (importers/megatron_index.py) before
anything is allocated for what it claims. A document is the .idx's (its document index: the sequences of one
document are one document), numbered file after file; each file is a shard, its documents grouped into blocks of
about `block_tokens` tokens, so an epoch is planned from a `Layout` as any dataset's is. The tokens of each block
come from the .idx (`tokens_per_block`: no pass over the data). The .bin is read by ranged reads of runs of
consecutive documents (`documents`: one request a run), each conditional on the version found at open, and
served as it lies: the .idx's dtype, nothing decoded.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from braceexpand import braceexpand

from ..errors import FormatError, ObjectNotFoundError, PackingError
from ..format.spec import Layout
from ..importers.megatron_index import HEADER, check_sequences, document_starts, header, within
from ..storage import Store
from ..storage.ranges import ByteRange
from ..storage.settings import StoreSettings
from ..storage.stats import Stats
from .options import ReaderOptions

BLOCK_TOKENS = 1 << 14  # tokens a block of documents holds, about: what a plan shuffles and a census counts
INDEX_HEAD = 1 << 20  # the first read of an .idx: the whole of most
CHECK_SEQUENCES = 1 << 20  # sequences checked at a time (what the checks allocate beside the index)
KEY = "tokens"
SAMPLED_FILES = 4  # files whose first block says which token the documents end with


@dataclass(frozen=True, eq=False)
class IndexedLayout(Layout):
    """A layout that also names the .idx files it was read from, so that a checkpoint or token counts made for
    another corpus of the same document counts are refused."""

    index: str = ""

    def digest(self) -> str:
        return hashlib.sha256(f"{super().digest()}/{self.index}".encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class CorpusFile:
    """One prefix: its folder's store, its token dtype, and where each of its documents lies in its .bin."""

    url: str  # the prefix
    store: Store
    name: str  # the prefix's last part: `name.idx`, `name.bin` in the store
    dtype: np.dtype
    tokens: np.ndarray  # tokens of each document
    starts: np.ndarray  # sequences back to back: the byte where each document starts, and where the last ends
    gapped: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # else: pointers, byte lengths, first sequence of each
    sequences: int
    bin_size: int
    digest: str  # of the .idx's bytes

    @property
    def bin(self) -> str:
        return f"{self.name}.bin"

    def __len__(self) -> int:
        return len(self.tokens)

    def spans(self, lo: int, hi: int) -> list[ByteRange]:
        """The byte ranges of documents lo..hi-1 (one, unless the .idx leaves gaps between sequences)."""
        if self.gapped is None:
            return [ByteRange(self.bin, int(self.starts[lo]), int(self.starts[hi]))]
        pointers, sizes, first = self.gapped
        a, z = int(first[lo]), int(first[hi])
        begins, ends = pointers[a:z], pointers[a:z] + sizes[a:z]
        cuts = np.flatnonzero(begins[1:] != ends[:-1]) + 1
        heads, tails = np.concatenate([[0], cuts]), np.concatenate([cuts - 1, [z - a - 1]])
        return [ByteRange(self.bin, int(begins[h]), int(ends[t])) for h, t in zip(heads, tails) if z > a]


def open_file(store: Store, name: str, url: str) -> CorpusFile:
    """One prefix's .idx read and checked (2 requests, 3 past INDEX_HEAD bytes) and its .bin's size and version
    found (1, at the same time); the .bin's reads then made conditional on that version."""
    idx_rel, idx_url, bin_rel = f"{name}.idx", f"{url}.idx", f"{name}.bin"
    found = store.beside(store.identity, bin_rel)
    head = bytes(store.read_head(idx_rel, INDEX_HEAD, "idx"))
    size = len(head) if 0 < len(head) < INDEX_HEAD else store.identity(idx_rel).size
    fields = header(head, idx_url, size)  # counts that do not fit the file are refused before any allocation
    body = head[: fields.size]
    if len(body) < fields.size:
        rest = ByteRange(idx_rel, len(body), fields.size)
        body += bytes(store.read_ranges([rest], "idx")[rest])
    identity = found.result()
    store.expect(bin_rel, identity)
    n, dtype = fields.sequences, fields.dtype
    lengths = np.frombuffer(body, np.int32, n, HEADER).astype(np.int64)
    pointers = np.frombuffer(body, np.int64, n, fields.pointers_at).copy()
    starts = document_starts(np.frombuffer(body, np.int64, fields.documents, fields.documents_at), n, idx_url)
    end = 0
    for lo in range(0, n, CHECK_SEQUENCES):
        part = slice(lo, lo + CHECK_SEQUENCES)
        end = check_sequences(lengths[part], pointers[part], dtype, lo, end, idx_url)
        within(lengths[part], pointers[part], dtype, lo, identity.size, f"{url}.bin")
    if not len(starts):  # no document index: the sequences are one document
        starts = np.array([0, n] if n else [0], dtype=np.int64)
    first = np.append(starts, n) if starts[-1] != n else starts.astype(np.int64)  # the last runs to the end
    tokens = np.add.reduceat(np.append(lengths, 0), first)[:-1] if len(first) > 1 else np.zeros(0, np.int64)
    tokens[first[:-1] == first[1:]] = 0  # reduceat gives an empty document the next sequence's length
    sizes = lengths * dtype.itemsize
    back_to_back = n == 0 or bool(np.all(pointers[1:] == pointers[:-1] + sizes[:-1]))
    begins = np.append(pointers, end if n else 0)
    return CorpusFile(
        url,
        store,
        name,
        dtype,
        tokens,
        begins[first] if back_to_back else np.zeros(0, np.int64),
        None if back_to_back else (pointers, sizes, first),
        n,
        identity.size,
        hashlib.sha256(body).hexdigest()[:16],
    )


@dataclass(frozen=True)
class Named:
    """A prefix, and the store of its folder."""

    store: Store
    name: str
    url: str


def prefixes(src: str | Sequence[str], storage_options: dict[str, Any] | None, settings: StoreSettings) -> list[Named]:
    """The prefixes a source names (prefixes, `.idx` or `.bin` URLs, brace patterns, globs in their last part), in
    the order given (a glob's sorted), each once, with the store of its folder: one store a folder, which also
    lists it for a glob (one delimited listing: no recursive glob, no second client)."""
    stores: dict[str, Store] = {}
    found: dict[str, Named] = {}
    for item in [src] if isinstance(src, str) else list(src):
        for url in braceexpand(str(item)):
            folder, _, name = (url if "://" in url else os.path.abspath(url)).rpartition("/")
            if any(c in folder for c in "*?["):
                raise ObjectNotFoundError("a glob names files of one folder: put the pattern in the last part", url=url)
            store = stores.setdefault(folder, Store(folder, storage_options, settings))
            names = [name]
            if any(c in name for c in "*?["):
                names = sorted(n for n in store.list_names() if fnmatch.fnmatchcase(n, name))  # one listing
                if not names:
                    raise ObjectNotFoundError("no file matches this pattern", url=url)
            for each in names:
                each = each[:-4] if each.endswith((".idx", ".bin")) else each
                found.setdefault(f"{folder}/{each}", Named(store, each, f"{folder}/{each}"))
    if not found:
        raise ObjectNotFoundError("no Megatron prefix given", url=str(src))
    return list(found.values())


class MegatronCorpus:
    """Documents of token ids in Megatron .bin/.idx files, read in place (see the module). Examples are
    `{"tokens": 1-D array of the .idx's dtype}`, one per document, numbered file after file; `len` is the
    documents. Pickles with its parsed index (a DataLoader worker reads no .idx again)."""

    def __init__(
        self,
        src: str | Sequence[str],
        storage_options: dict[str, Any] | None = None,
        *,
        block_tokens: int = BLOCK_TOKENS,
        options: ReaderOptions | None = None,
    ) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.storage_options = dict(storage_options or {})
        self.options = options or ReaderOptions()
        self.src, self.block_tokens = src if isinstance(src, str) else list(src), block_tokens
        found = prefixes(src, storage_options, self.options.storage)
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        self.url = src if isinstance(src, str) else found[0].url + more
        with ThreadPoolExecutor(min(16, len(found)), thread_name_prefix="atlas-idx") as pool:
            opened = [pool.submit(open_file, p.store, p.name, p.url) for p in found]
            self.files = [f.result() for f in opened]
        self.stores = list({id(p.store): p.store for p in found}.values())
        sizes = np.array([len(f) for f in self.files], dtype=np.int64)
        self.ends = np.cumsum(sizes)
        self._layout = IndexedLayout(
            sizes,
            np.array([self._block_size(f, block_tokens) for f in self.files], dtype=np.int64),
            hashlib.sha256("/".join(f.digest for f in self.files).encode()).hexdigest()[:16],
        )
        self._ends_with: tuple[int | None] | None = None

    @staticmethod
    def _block_size(file: CorpusFile, block_tokens: int) -> int:
        total = int(file.tokens.sum())
        return int(min(max(round(block_tokens * len(file) / max(total, 1)), 1), max(len(file), 1)))

    # -- what a plan and a TokenStream ask ------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shards(self) -> list[CorpusFile]:
        """The files, in order (errors name a shard by its `name`)."""
        return self.files

    @property
    def store(self) -> Store:
        """The first file's store (which client reads it is every file's)."""
        return self.stores[0]

    def layout(self) -> IndexedLayout:
        """Documents per file, documents per block: what an epoch is planned from (digest: the .idx files')."""
        return self._layout

    def tokens_per_block(self, key: str = KEY) -> np.ndarray:
        """Tokens in each block (uint32; blocks numbered file after file), from the .idx: what `TokenCounts.of`
        takes instead of a pass over the data."""
        if key != KEY:
            raise PackingError(f"a Megatron corpus holds its token ids under {KEY!r}, not {key!r}", url=self.url)
        floats = [f for f in self.files if f.dtype.kind not in "iu"]
        if floats:
            raise PackingError(
                f"{floats[0].dtype} values (dtype code of its .idx), not integer token ids: not a token corpus",
                url=floats[0].url,
            )
        per_file = []
        for f, block in zip(self.files, self._layout.block_sizes.tolist()):
            starts = np.arange(0, len(f), block)
            per_file.append(np.add.reduceat(f.tokens, starts) if len(f) else np.zeros(0, np.int64))
        counts = np.concatenate([np.zeros(0, np.int64), *per_file])
        if len(counts) and counts.max() >= 1 << 32:  # a document of 2^32 tokens or more
            raise PackingError(f"a block of {int(counts.max()):,} tokens: blocks of fewer than 2^32 are counted")
        return counts.astype(np.uint32)

    def locate(self, first: int, count: int) -> tuple[CorpusFile, int]:
        """The file holding documents first..first+count-1 and the first's place in it (ValueError across files)."""
        if count < 0 or first < 0 or first + count > len(self):
            raise IndexError(f"{self.url}: documents {first}..{first + count - 1} are not all among its {len(self)}")
        f = int(np.searchsorted(self.ends, first, side="right"))
        lo = first - int(self.ends[f] - len(self.files[f]))
        if lo + count > len(self.files[f]):
            raise ValueError(f"documents {first}..{first + count - 1} cross from {self.files[f].url} to the next")
        return self.files[f], lo

    def documents(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of documents first..first+count-1 (consecutive, in one file) back to back, read-only, and
        each one's length: one ranged read (one per stretch where the .idx leaves gaps)."""
        return self.runs([(first, count)])[0]

    def runs(self, spans: Sequence[tuple[int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`documents(first, count)` of each (first, count), their ranged reads in flight together."""
        located: list[tuple[CorpusFile, int, int, list[ByteRange]]] = []
        for first, count in spans:
            if count == 0 and 0 <= first <= len(self):
                located.append((self.files[0], 0, 0, []))
                continue
            file, lo = self.locate(first, count)
            located.append((file, lo, count, file.spans(lo, lo + count)))
        got: dict[ByteRange, Any] = {}
        for store in self.stores:
            mine = [r for file, _, _, ranges in located if file.store is store for r in ranges]
            got.update(store.read_ranges(mine, "bin") if mine else {})
        out = []
        for file, lo, count, ranges in located:
            parts = [np.frombuffer(got[r], file.dtype) for r in ranges]
            flat = parts[0] if len(parts) == 1 else np.concatenate([np.zeros(0, file.dtype), *parts])
            out.append((flat, file.tokens[lo : lo + count]))
        return out

    def read(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, np.ndarray]]:
        """Documents at indices, in that order (writable copies): consecutive ones read together, every range in
        flight at once."""
        wanted = np.asarray(indices, dtype=np.int64).ravel()
        if not len(wanted):
            return []
        if wanted.min() < 0 or wanted.max() >= len(self):
            bad = int(wanted.min()) if wanted.min() < 0 else int(wanted.max())
            raise IndexError(f"{self.url}: index {bad} out of range (the corpus has {len(self)} documents)")
        unique = np.unique(wanted)
        file_of = np.searchsorted(self.ends, unique, side="right")
        cuts = np.flatnonzero((np.diff(unique) != 1) | (np.diff(file_of) != 0)) + 1
        stretches = [(int(s[0]), len(s)) for s in np.split(unique, cuts)]
        out: dict[int, dict[str, np.ndarray]] = {}
        for (first, _), (flat, lengths) in zip(stretches, self.runs(stretches)):
            for k, tokens in enumerate(np.split(np.array(flat), np.cumsum(lengths)[:-1])):
                out[first + k] = {KEY: tokens}
        return [out[i] for i in wanted.tolist()]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"{self.url}: index {index} out of range (the corpus has {len(self)} documents)")
        return self.read([index % len(self)])[0]

    def iter(self, start: int = 0, stop: int | None = None, chunk: int = 1024) -> Iterator[dict[str, np.ndarray]]:
        """Documents start..stop-1 in order, `chunk` at a time."""
        stop = len(self) if stop is None else min(stop, len(self))
        for lo in range(start, stop, chunk):
            yield from self.read(np.arange(lo, min(lo + chunk, stop)))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.iter()

    # -- end-of-document tokens ---------------------------------------------------------------------------

    def ends_with(self) -> int | None:
        """The token the documents end with, if every document of the first block of each of the first
        SAMPLED_FILES files ends with the same one (a corpus written with `--append-eod`), else None: one ranged
        read a file sampled, once."""
        if self._ends_with is None:
            last: list[np.ndarray] = []
            for k, first in enumerate(self._layout.starts[:SAMPLED_FILES].tolist()):
                flat, lengths = self.documents(first, min(len(self.files[k]), int(self._layout.block_sizes[k])))
                last.append(flat[np.cumsum(lengths)[lengths > 0] - 1])
            found = np.concatenate([np.zeros(0, np.int64), *last])
            self._ends_with = (int(found[0]) if len(found) > 1 and np.all(found == found[0]) else None,)
        return self._ends_with[0]

    # -- reporting ----------------------------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """Requests and bytes of this process so far, every file's (`idx` and `bin` reads)."""
        total = Stats()
        for store in self.stores:
            got = store.snapshot()
            total.requests.update(got.requests)
            total.bytes.update(got.bytes)
            total.retries += got.retries
        return total

    def reset_stats(self) -> None:
        for store in self.stores:
            store.reset_stats()

    def describe(self) -> dict[str, Any]:
        """What `atlas-remote info` reports of a corpus, as data."""
        tokens = int(sum(int(f.tokens.sum()) for f in self.files))
        ends_with = self.ends_with()
        stats = self.stats
        return {
            "url": self.url,
            "format": "megatron",
            "files": [f.url for f in self.files],
            "documents": len(self),
            "sequences": sum(f.sequences for f in self.files),
            "tokens": tokens,
            "dtype": sorted({str(f.dtype) for f in self.files}),
            "tokens_per_document": round(tokens / len(self), 1) if len(self) else None,
            "bytes_stored": sum(f.bin_size for f in self.files),
            "block_documents": sorted(set(self._layout.block_sizes.tolist())),
            "ends_with": ends_with,
            "read_client": self.store.read_client,
            "requests": dict(stats.requests),
            "bytes_fetched": stats.total_bytes,
        }

    def reopen(self) -> MegatronCorpus:
        """The corpus as it is now (after DatasetChangedError: a .bin rewritten), same sources and settings."""
        return MegatronCorpus(self.src, self.storage_options, block_tokens=self.block_tokens, options=self.options)

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def __enter__(self) -> MegatronCorpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MegatronCorpus({self.url!r}, files={len(self.files)}, documents={len(self)})"


def megatron(
    prefix: str | Sequence[str], storage_options: dict[str, Any] | None = None, *, block_tokens: int = BLOCK_TOKENS
) -> MegatronCorpus:
    """A Megatron corpus (`prefix.idx` + `prefix.bin`; several: a list, a glob or a brace pattern of prefixes or
    `.idx` URLs) on any URL, read in place: give it to `TokenStream`, a `Mixture` or `ShuffledStream` as a
    dataset. FormatError (one line, naming the file) if an .idx does not describe its .bin."""
    return MegatronCorpus(prefix, storage_options, block_tokens=block_tokens)


def is_megatron(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether a URL names a Megatron corpus: an .idx or .bin, or a prefix with an .idx beside it (one request)."""
    if url.endswith((".idx", ".bin")):
        return True
    folder, _, name = url.rstrip("/").rpartition("/")
    try:
        return Store(folder or ".", storage_options).exists(f"{name}.idx")
    except (ObjectNotFoundError, FormatError):
        return False
