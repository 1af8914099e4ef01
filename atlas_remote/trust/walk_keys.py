"""What a block's walk learns from keys hashed, globals called and BUILD: the hash work and colliding keys of
every dict, set and frozenset (only str and bytes hashes are randomized; an int's is its value modulo 2^61-1),
what each allowed global's call makes, and the state a BUILD may set (never an allowed global's, never a torch
tensor's). `pickle_walk` runs the opcodes; `docs/security.md` has the figures."""

from __future__ import annotations

from typing import Any

from .walk_graph import (
    _FACTORY_KINDS,
    _FACTORY_VALUES,
    ARRAY,
    BYTEARRAY,
    BYTES,
    C_DATED,
    C_USER,
    DATED,
    DEQUE,
    DICT,
    DTYPE,
    F_BYTES,
    F_STR,
    FROZENSET,
    GLOBAL,
    ITEMS,
    KIND,
    M_ARRAY,
    M_BYTEARRAY,
    M_COUNTER,
    M_DDICT,
    M_DEQUE,
    M_DTYPE,
    M_NOTHING,
    M_ODICT,
    M_STORAGE,
    M_TENSOR,
    M_USER,
    MAPPING,
    OBJ,
    SAME_HASH,
    SET,
    SMALL_INT,
    STR,
    TENSOR,
    TREE,
    TUPLE,
    UNKNOWN_HASH,
    UNKNOWN_WORK,
    USER,
    Refused,
    _made,
    _nest,
    _node,
)


class _Keys:
    """What the keys hashed so far cost: hash work (objects visited) and comparisons among unknown hashes."""

    def __init__(self, bound: int) -> None:
        self.bound, self.work, self.unknown = bound, 0, 0
        self.nodes: list = []  # keys that are containers, for a recount over the final graph
        self.models: dict[int, Any] = {}  # id of a key that is a container -> its model
        self.counts: dict[int, dict[int, int]] = {}  # id of a container -> hash -> keys with it
        self.unknowns: dict[int, int] = {}  # id of a container -> keys whose hash the walk cannot know


def _model(key: Any, models: dict[int, Any], depth: int = 0) -> Any:
    """A value whose hash collides with another's when the keys' hashes do (the key itself for numbers; tuples
    and frozensets of models; str and bytes by their bytes), or UNKNOWN_HASH."""
    if type(key) is not list:
        return key
    model = models.get(id(key))
    if model is not None:
        return model
    kind = key[KIND]
    if kind in (TUPLE, FROZENSET, DATED) and depth < 64:
        parts = [_model(item, models, depth + 1) for item in key[ITEMS]]
        if any(part is UNKNOWN_HASH for part in parts):
            model = UNKNOWN_HASH
        elif kind == FROZENSET:
            model = frozenset(parts)
        else:
            model = (kind, *parts) if kind == DATED else tuple(parts)
    elif kind in (GLOBAL, TENSOR):
        model = (GLOBAL, id(key))  # hashed by identity
    else:
        model = UNKNOWN_HASH
    models[id(key)] = model
    return model


def _hashed(container: list, keys: list, tally: _Keys) -> None:
    """Keys about to be hashed into `container` (a dict, set or frozenset)."""
    counts = tally.counts.get(id(container))
    for key in keys:
        kind = type(key)
        if kind is bytes or key is STR or key is BYTES or key is None or kind is bool:
            continue
        if kind is int:
            if -SMALL_INT < key < SMALL_INT and key != -1:
                continue
            tally.work += key.bit_length() // 30 + 1  # an int's hash is not cached
        elif kind is list:
            if key[KIND] == GLOBAL or key[KIND] == TENSOR:
                continue  # hashed by identity
            tally.work += key[TREE]  # a tuple's hash is not cached: it visits all of it
            tally.nodes.append(key)
        if tally.work > tally.bound:
            raise Refused(
                f"hashing its keys would visit more than {tally.bound:,} objects: read it only if you trust it "
                f"(trusted=True)"
            )
        model = _model(key, tally.models)
        if model is UNKNOWN_HASH:
            unknown = tally.unknowns[id(container)] = tally.unknowns.get(id(container), 0) + 1
            tally.unknown += unknown
            if tally.unknown > UNKNOWN_WORK:
                raise Refused(
                    f"it has more keys whose hash the walk cannot know ({unknown:,} in one container) than keys of "
                    f"data need: read it only if you trust it (trusted=True)"
                )
            continue
        if counts is None:
            counts = tally.counts[id(container)] = {}
        digest = hash(model)
        same = counts[digest] = counts.get(digest, 0) + 1
        if same > SAME_HASH:
            raise Refused(
                f"{same} of the keys of one dict or set share one hash, which makes inserting them quadratic "
                f"(no data needs more than {SAME_HASH}): read it only if you trust it (trusted=True)"
            )


def _pairs_keys(items: Any, counter: bool) -> list:
    """The keys an OrderedDict, defaultdict or Counter made from `items` (a dict, or a list of pairs) hashes."""
    if type(items) is not list:
        return []
    if items[KIND] in (DICT, MAPPING):
        return items[ITEMS][0::2]
    if counter:
        return items[ITEMS]
    return [pair[ITEMS][0] for pair in items[ITEMS] if type(pair) is list and pair[ITEMS]]


def _call(makes: int, args: list, tally: _Keys, max_tree: int) -> Any:
    """What calling an allowed global with `args` makes, as the walk keeps it (its wrapper checks the arguments)."""
    if makes in _FACTORY_KINDS:
        kind = _FACTORY_KINDS[makes]
        if not args:
            return _node(kind)
        node = _made(args[:1], kind, max_tree)  # set(list): the list's items, one level deeper
        if kind in (SET, FROZENSET) and type(args[0]) is list:
            _hashed(node, args[0][ITEMS], tally)
        return node
    if makes in _FACTORY_VALUES:
        return _FACTORY_VALUES[makes]
    if makes == F_STR:
        return STR
    if makes == F_BYTES:
        return BYTES
    if makes == M_BYTEARRAY:
        return BYTEARRAY
    if makes in (M_ODICT, M_DDICT, M_COUNTER):
        node = _made(list(args), MAPPING, max_tree)
        if makes == M_DDICT:
            items = args[1] if len(args) > 1 else None
        else:
            items = args[0] if args else None
        _hashed(node, _pairs_keys(items, makes == M_COUNTER), tally)
        return node
    if makes == M_NOTHING:
        raise ValueError("numpy.ndarray is not called by a numpy pickle")
    kind = {
        M_DEQUE: DEQUE,
        M_DTYPE: DTYPE,
        M_ARRAY: ARRAY,
        M_TENSOR: TENSOR,
        M_STORAGE: TENSOR,
        M_USER: USER,
        C_USER: USER,
        C_DATED: DATED,
    }.get(makes, OBJ)
    return _made(list(args), kind, max_tree)


def _build(target: Any, state: Any, max_tree: int) -> bool:
    """BUILD (`__setstate__`, or attributes set) on `target`: refused where it would change what outlives the
    block or set a tensor's storage; True when the target was already nested (see _nest)."""
    if type(target) is not list:
        raise ValueError("BUILD on a constant")
    kind = target[KIND]
    if kind == GLOBAL:
        raise Refused(
            "it sets the state of an allowed global (BUILD), which would change it for every block read after: "
            "not data, refused"
        )
    if kind == TENSOR:
        raise Refused("it sets the state of a torch tensor or storage (BUILD), which can resize it: not data, refused")
    if kind == ARRAY:
        raw = state[ITEMS][-1] if type(state) is list and state[KIND] == TUPLE and state[ITEMS] else None
        if type(raw) is not bytes and raw is not BYTES:
            raise Refused("a numpy array's state holds its data as bytes; this one holds objects: refused")
    return _nest(target, [state], max_tree)
