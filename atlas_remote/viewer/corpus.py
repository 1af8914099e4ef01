"""The viewer's answers for a Megatron corpus read in place (read/megatron.py): the same four questions as an
Atlas dataset's (pages.py), answered from its .idx where they can be: documents and tokens per file, and every
document's length as a histogram, with no read of the .bin; a page of documents is one ranged read."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AtlasError
from ..read.megatron import MegatronCorpus
from .pages import HISTOGRAM_BINS, DatasetView


class CorpusView(DatasetView):
    """Answers for the page over a Megatron corpus (`answer` and `page` as a dataset's)."""

    ds: MegatronCorpus  # type: ignore[assignment]

    def __init__(self, ds: MegatronCorpus) -> None:
        super().__init__(ds)  # type: ignore[arg-type]  # what DatasetView's own answers need is overridden here

    def summary(self) -> dict[str, Any]:
        facts = self.ds.describe()
        end = facts["ends_with"]
        return {
            "url": facts["url"],
            "examples": facts["documents"],
            "shards_present": len(facts["files"]),
            "facts": [
                ["format", f"Megatron IndexedDataset, read in place: {len(facts['files'])} file(s)"],
                ["documents", f"{facts['documents']:,} ({facts['sequences']:,} sequences)"],
                [
                    "tokens",
                    f"{facts['tokens']:,} ({', '.join(facts['dtype'])}), {facts['tokens_per_document']} a document",
                ],
                ["stored", f"{facts['bytes_stored']:,} bytes in .bin files"],
                [
                    "ends with",
                    f"token {end} in every document sampled (--append-eod)" if end is not None else "no one token",
                ],
                ["reads via", facts["read_client"]],
            ],
        }

    def shards(self) -> dict[str, Any]:
        """Per file: documents and .bin bytes (from the .idx and the sizes found at open)."""
        files = self.ds.files
        return {
            "numbers": list(range(len(files))),
            "names": [f.name for f in files],
            "examples": [len(f) for f in files],
            "bytes": [f.bin_size for f in files],
        }

    def sample(self) -> dict[str, Any]:
        """Every document's length in tokens, from the .idx: a histogram and its spread (nothing read)."""
        lengths = np.concatenate([np.zeros(0, np.int64), *(f.tokens for f in self.ds.files)])
        counts, edges = np.histogram(lengths, bins=HISTOGRAM_BINS) if len(lengths) else (np.zeros(0), np.zeros(0))
        spread = None
        if len(lengths):
            spread = {"min": int(lengths.min()), "median": float(np.median(lengths)), "max": int(lengths.max())}
        return {
            "lengths": {"edges": edges.tolist(), "counts": counts.astype(int).tolist()},
            "documents": len(lengths),
            "tokens": spread,
        }

    def _measured(self, read: dict[int, Any]) -> dict[int, Any]:
        """A document is a token array the .bin holds: nothing in it is shared, nothing to measure."""
        return read

    def _examples(self, start: int, stop: int) -> dict[int, Any]:
        """Documents start..stop in one read; a read refused stands as its error in every row."""
        try:
            return dict(zip(range(start, stop), self.ds.read(range(start, stop))))
        except AtlasError as err:
            return dict.fromkeys(range(start, stop), err)
