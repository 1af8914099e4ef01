"""The Hugging Face Hub's layouts: which split (and config) a file belongs to, so that `split=` keeps one and a
folder holding several is refused rather than read as one silent mix of train and test.

The layouts are the ones `datasets` reads: `data/train-00000-of-00002.parquet` (the split opens the file's
name), `train.parquet`, `train/0000.parquet` (a folder named after the split) and the Hub's Parquet conversion,
`<config>/<split>/0000.parquet` (`hf://datasets/ORG/NAME@~parquet`), where a folder with several configs is
refused too: give the config's folder.
"""

from __future__ import annotations

import re

from ..errors import FormatError

SPLITS = ("train", "training", "validation", "valid", "val", "dev", "test", "testing", "eval", "evaluation")
_NAMED = re.compile(rf"^(?:.*[-_. ])?({'|'.join(SPLITS)})(?:[-_. 0-9].*)?$")


def split_of(rel: str, split: str | None = None) -> tuple[str | None, str | None]:
    """(the split a file's path names, the config folder above a split folder); `split` is also looked for,
    whatever its name."""
    *folders, name = rel.split("/")
    stem = name.split(".", 1)[0]
    if split and (stem == split or stem.startswith(f"{split}-")):
        return split, None
    named = _NAMED.match(stem)
    if named:
        return named.group(1), None
    names = (*SPLITS, split) if split else SPLITS
    for depth in range(len(folders) - 1, -1, -1):  # the nearest folder named after a split
        if folders[depth] in names:
            return folders[depth], folders[depth - 1] if depth else None
    return None, None


def select_split(folder: str, rels: list[str], split: str | None) -> list[str]:
    """The files of one split of a folder (all of them if it has none), refusing a mix of splits or configs."""
    found = {rel: split_of(rel, split) for rel in rels}
    if split is not None:
        rels = [rel for rel in rels if found[rel][0] == split]
    else:
        splits = sorted({s for s, _ in found.values() if s is not None})
        if len(splits) > 1:
            raise FormatError(
                f"this folder holds the splits {', '.join(splits)}: choose one (--split, or split=) rather than "
                f"read them as one",
                url=folder,
            )
    configs = sorted({config for rel in rels if (config := found[rel][1]) is not None})
    if len(configs) > 1:
        raise FormatError(
            f"this folder holds the configs {', '.join(configs)}: give one config's folder as the source", url=folder
        )
    return rels
