"""Names of the files we keep beside the format's (the lease, staging, journals) and which files are the
format's: what the read path may know of writing without importing any of it."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import FormatError, ObjectNotFoundError
from ..storage import Store
from .manifest import MANIFEST
from .spec import (
    BLOCKS_FILE,
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    ROOT_META,
    SHARD_META,
    parse_shard_name,
)

LEASE = ".atlas-lease"  # a file, so the original reader (which takes every folder for a shard) never sees it
STAGING = ".atlas-staging"  # hidden from readers: not a shard name, and gone once a dataset is committed
JOURNAL = "commit.json"
SHARD_FILES = frozenset({SHARD_META, DATA_FILE, INDEX_FILE, DICT_FILE, CHECKSUM_FILE, BLOCKS_FILE})


def is_atlas_file(rel: str) -> bool:
    """Whether a path (relative to the dataset root) is one the format defines, or our manifest: only these are
    ever deleted."""
    parts = rel.split("/")
    if len(parts) == 1:
        return parts[0] in (ROOT_META, DICT_FILE, MANIFEST)
    return len(parts) == 2 and parse_shard_name(parts[0]) is not None and parts[1] in SHARD_FILES


def pending_journals(store: Store) -> list[str]:
    """Staging folders holding a commit journal: commits that were started and not finished."""
    try:
        tokens = store.list_names(STAGING)
    except ObjectNotFoundError:
        return []
    return [t for t in tokens if store.exists(f"{STAGING}/{t}/{JOURNAL}")]


def refuse_links_out(store: Store, rels: Iterable[str]) -> None:
    """FormatError, before anything is done, if a local path (a folder or file a commit or recover is about to
    move, write or delete) is a symbolic link, or lies under one, leading out of the dataset's folder: a staging
    folder from someone's archive must not move or delete files elsewhere on the machine. Object stores have no
    links."""
    if not store.is_local:
        return
    root = os.path.realpath(store.path(""))
    folders: dict[str, str] = {}  # each folder resolved once: a commit names thousands of files in a few folders
    for rel in rels:
        folder, name = os.path.split(store.path(rel))
        if folder not in folders:
            folders[folder] = os.path.realpath(folder)
        path = os.path.join(folders[folder], name)
        target = os.path.realpath(path) if os.path.islink(path) else path
        if os.path.commonpath([root, target]) != root:
            raise FormatError(
                f"{rel} is a symbolic link to {target}, or lies under one, outside the dataset; nothing was done "
                f"(remove the link, or copy what it leads to into the dataset's folder)",
                url=store.url,
            )
