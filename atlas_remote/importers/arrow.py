"""Arrow IPC files (Feather v2, `.arrow`) and Hugging Face `save_to_disk` folders: one example per row, as a dict,
read with pyarrow (the `parquet` extra), record batch by record batch, values as parquet.py describes.

A `save_to_disk` folder names its files in `state.json` (`_data_files`), in order, and writes them as Arrow
streams; a saved DatasetDict is a folder of those, one per split, named in `dataset_dict.json`. A lone file may be
either IPC form, which is tried in turn. A folder of files is read as hub.py says (one split).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import AtlasError, FormatError
from .arrow_ipc import check
from .arrow_values import PlainRows
from .hub import select_split
from .parquet import pyarrow_modules
from .sources import expand, files_below, open_source, read_small, source, source_error

SUFFIXES = (".arrow", ".feather", ".ipc")
STATE_BYTES = 1 << 20  # datasets writes a few hundred bytes a file
PLAIN_NAME = re.compile(r"[^/\\:]+")  # no folder, no drive, no scheme


def inputs(
    src: str | Iterable[str], storage_options: dict[str, Any] | None = None, columns=None, split=None
) -> list[str]:
    found: list[str] = []
    for url in expand(src, storage_options):
        folder = source(url, storage_options)
        if folder.is_folder() and folder.exists("dataset_dict.json"):  # DatasetDict.save_to_disk: a folder a split
            url = f"{url.rstrip('/')}/{_one_split(folder, url, split)}"
            folder = source(url, storage_options)
        if folder.is_folder() and folder.exists("state.json"):  # Dataset.save_to_disk
            try:
                state = json.loads(read_small(folder, "state.json", STATE_BYTES))
                names = [entry["filename"] for entry in state["_data_files"]]
            except (ValueError, KeyError, TypeError, RecursionError) as err:
                raise FormatError(f"unreadable save_to_disk state.json ({err})", url=url) from err
            for name in names:  # the folder's own files: a stranger's state.json must not name others
                if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or name in (".", ".."):
                    raise FormatError(
                        f"save_to_disk state.json names {str(name)[:100]!r}, not a file of its folder: refused",
                        url=url,
                    )
            found += [f"{url.rstrip('/')}/{name}" for name in names]
        else:
            found += files_below(url, storage_options, SUFFIXES, split, select_split)
    return found


def _one_split(folder: Any, url: str, split: str | None) -> str:
    """The split folder of a saved DatasetDict: `split`, or its only one (several, unchosen, are refused)."""
    try:
        splits = list(json.loads(read_small(folder, "dataset_dict.json", STATE_BYTES))["splits"])
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise FormatError(f"unreadable save_to_disk dataset_dict.json ({err})", url=url) from err
    if split is not None and split not in splits:
        raise FormatError(f"no split {split!r} (it has {', '.join(splits)})", url=url)
    if split is None and len(splits) != 1:
        raise FormatError(
            f"this DatasetDict holds the splits {', '.join(splits)}: choose one (--split, or split=) rather than "
            f"read them as one",
            url=url,
        )
    return split or splits[0]


def _batches(pyarrow: Any, raw: Any) -> Iterator[Any]:
    try:
        reader = pyarrow.ipc.open_file(raw)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    except pyarrow.ArrowInvalid:  # not the file form: the stream form (what save_to_disk writes)
        raw.seek(0)
        yield from pyarrow.ipc.open_stream(raw)


def samples(
    urls: str | Iterable[str],
    storage_options: dict[str, Any] | None = None,
    columns: list[str] | None = None,
    split: str | None = None,
) -> Iterator[dict[str, Any]]:
    pyarrow = pyarrow_modules()
    for url in inputs(urls, storage_options, split=split):
        try:
            with open_source(url, storage_options) as raw:
                check(raw, raw.seek(0, 2))  # what its compressed batches decompress to, before pyarrow does it
                raw.seek(0)
                rows = PlainRows(pyarrow)
                for batch in _batches(pyarrow, raw):
                    if columns:
                        missing = sorted(set(columns) - set(batch.schema.names))
                        if missing:
                            raise FormatError(f"no column {missing[0]!r} (it has {', '.join(batch.schema.names)})")
                        batch = batch.select(columns)
                    yield from rows(batch)
        except AtlasError as err:
            raise err.located(url=url)
        except Exception as err:
            raise source_error(err, url) from err
