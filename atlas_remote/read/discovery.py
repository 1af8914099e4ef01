"""Finding a dataset: its root meta.json and manifest (read together, one round trip), what tells the version
opened from a rewrite (`RootVersion`), and which shard folders it has (a listing, the manifest, or the root's
count). The shard table (shards.py) serves what is found here."""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

import numpy as np

from ..errors import AtlasError, DatasetNotFoundError, FormatError, ObjectNotFoundError
from ..format.manifest import MANIFEST, Manifest, root_digest
from ..format.names import pending_journals
from ..format.spec import ROOT_META, AtlasDatasetMetadata, parse_shard_name, shard_name
from ..storage import Store

log = logging.getLogger(__name__)


class Present(NamedTuple):
    """The shards a reader serves, in order: their numbers, and their folder names where a listing found them."""

    numbers: np.ndarray  # int64, increasing
    names: list[str] | None  # None: the format's names (zero-padded to the width of the root's last shard)


class RootVersion(NamedTuple):
    """What tells a rewritten dataset from the one a reader opened: the bytes of its root meta.json and manifest
    (the manifest digests every shard's index and checksums), and, without a usable manifest, the root meta.json's
    object version (a rewrite with the same shapes writes the same root bytes, but a new object)."""

    root: str  # SHA-256 of the root meta.json
    manifest: str | None  # SHA-256 of the manifest, None if absent
    object: str | None  # the root meta.json's object version and time written (None with a manifest): S3's ETag
    # is the content's MD5, so a rewrite of the same bytes is told apart by its time, to the second


class Root(NamedTuple):
    """What a reader opened: the root meta.json, the manifest if usable, and its version (None for a lone
    shard)."""

    layout: AtlasDatasetMetadata
    manifest: Manifest | None
    version: RootVersion | None


def read_root(store: Store, manifest: bool = True) -> Root:
    """The root meta.json and, fetched beside it, the manifest if there is a usable one (one round trip). A
    manifest that is damaged or was written for another root meta.json is left aside, with a warning."""
    wanted = [(ROOT_META, "meta")] + ([(MANIFEST, "manifest")] if manifest else [])
    raw, *found = store.read_many(wanted)
    if isinstance(raw, ObjectNotFoundError):
        store.check_bucket()  # a missing bucket is named as such (one more request, on this path only)
        if pending_journals(store):
            raise DatasetNotFoundError(
                f"no {ROOT_META}: a commit here was interrupted; `atlas-remote recover URL` (or the next writer) "
                f"finishes it",
                url=store.url,
            ) from raw
        raise DatasetNotFoundError(
            f"no {ROOT_META} here: not an Atlas dataset, or not committed yet", url=store.url
        ) from raw
    if isinstance(raw, AtlasError):
        raise raw from raw.__cause__
    try:
        layout = AtlasDatasetMetadata.from_json(raw, ROOT_META)
    except FormatError as err:
        raise err.located(url=store.url)
    other = found[0] if found else None
    usable = _usable_manifest(store, raw, layout, other)
    root_object = None if usable is not None else object_version(store)
    return Root(layout, usable, RootVersion(*digests(raw, other), root_object))


def object_version(store: Store) -> str:
    identity = store.identity(ROOT_META)
    return f"{identity.version}@{identity.modified}"


def digests(root: bytes, manifest: bytes | AtlasError | None) -> tuple[str, str | None]:
    return root_digest(root), root_digest(manifest) if isinstance(manifest, bytes) else None


def _usable_manifest(store: Store, root: bytes, layout: AtlasDatasetMetadata, raw: bytes | AtlasError | None):
    if raw is None or isinstance(raw, ObjectNotFoundError):
        return None
    try:
        if isinstance(raw, AtlasError):
            raise raw
        manifest = Manifest.decode(raw, MANIFEST, shards=len(layout.shard_sizes))
    except AtlasError as err:
        log.warning("%s: %s; reading without it", store.url, err.located(url=store.url))
        return None
    if not manifest.describes(root, layout.shard_sizes):
        log.warning(
            "%s: %s was written for another %s (the dataset was rewritten by a tool that does not know "
            "manifests); reading without it: `atlas-remote index URL` rebuilds it",
            store.url,
            MANIFEST,
            ROOT_META,
        )
        return None
    return manifest


LISTED_AT_OPEN = 990  # shards: with the root's own files, one listing page (S3 and GCS answer 1,000 names a page)


def present_shards(store: Store, root: Root, names: list[str] | None = None) -> Present:
    """The shards a reader serves, decided when it opens. A listing decides, as it does for the format's original
    reader (the folders present are served, in order), wherever it is cheap: a local disk or memory, and an
    object store when the dataset has at most LISTED_AT_OPEN shards (one more request). Beyond that the manifest
    decides (opening stays 2 requests at any shard count), and a shard it lists that has gone is named when first
    touched. Without a manifest: a listing, or, where the store cannot list (HTTP), every shard the root names."""
    count = len(root.layout.shard_sizes)
    cheap = store.can_list and (not store.remote or count <= LISTED_AT_OPEN)
    if root.manifest is not None and not cheap:
        return Present(root.manifest.numbers, None)
    return find_shards(store, root.layout, names)


def find_shards(store: Store, layout: AtlasDatasetMetadata, names: list[str] | None = None) -> Present:
    """The shard folders present: from the root's listing (names, or one listing now), or, where the store cannot
    list, all that the root names. A folder named by digits must be a shard the root names, by its name: the
    original reader takes every folder for a shard, and would serve `0`, `00` and `000` as three; here the
    dataset is refused, so a shard is never counted twice and never beyond the root's count."""
    count = len(layout.shard_sizes)
    if not store.can_list:
        return Present(np.arange(count, dtype=np.int64), None)
    found: list[tuple[int, str]] = []
    for name in store.list_names() if names is None else names:
        number = parse_shard_name(name)
        if number is None:
            continue
        if number >= count:
            raise FormatError(
                f"shard folder {name!r} is beyond the {count} shards listed in {ROOT_META}",
                url=store.url,
                shard=name,
            )
        if name != shard_name(number, count):  # `0`, `00` and `000` would be one shard served three times
            raise FormatError(
                f"folder {name!r} looks like a shard but the format names shard {number} of {count} "
                f"{shard_name(number, count)!r} (every shard folder has as many digits as the last one's number): "
                f"rename or remove it",
                url=store.url,
                shard=name,
            )
        if store.is_local:
            _refuse_links_out(store, name)
        found.append((number, name))
    found.sort()
    return Present(np.asarray([n for n, _ in found], dtype=np.int64), [name for _, name in found])


def _refuse_links_out(store: Store, name: str) -> None:
    """A local shard folder that is a symbolic link must stay inside the dataset's root: a dataset unpacked from
    someone's archive must not make a reader (or a writer's cleanup) reach files elsewhere on the machine."""
    path = store.path(name)
    if os.path.islink(path):
        root = os.path.realpath(store.path(""))
        target = os.path.realpath(path)
        if os.path.commonpath([root, target]) != root:
            raise FormatError(
                f"shard folder {name!r} is a symbolic link to {target}, outside the dataset; copy the shard "
                f"into the dataset's folder instead",
                url=store.url,
                shard=name,
            )
