"""The records a block's walk keeps, and the shape of what they build: how deep containers nest and how many
objects a recursive walk of them visits, kept as containers are made and, when one changed after it was nested
(a cycle, or a crafted block), recomputed over the final graph with strongly connected components weighed by
their size (`pickle_walk` runs the opcodes; `docs/security.md` has the figures)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UnsafePickleError

if TYPE_CHECKING:
    from .walk_keys import _Keys

AMPLIFICATION = 128  # what a block may build, as a multiple of its decompressed bytes (above FLOOR_BYTES)
FLOOR_BYTES = 1 << 20
MAX_BLOCK_MULTIPLE = 2  # ... and never more than this many times max_block_bytes, however large the block
MAX_DEPTH = 1000  # containers within containers (Python's own recursion limit; C code overflowed past 100,000)
TREE_PER_BYTE, TREE_FLOOR = 32, 1 << 20  # objects a recursive walk of a block may visit: per byte, plus a floor
SAME_HASH = 8  # keys of one dict or set that may share one hash
UNKNOWN_WORK = 1 << 21  # comparisons keys the walk cannot hash may cost (n keys of one container: n^2 / 2)
SMALL_INT = (1 << 61) - 1  # ints below this in size hash to themselves (but -1): no two collide

# what a container record holds, in order
KIND, DEPTH, TREE, NESTED, ITEMS, MAKES = range(6)  # ITEMS: () until it has some; MAKES: globals only
# kinds of records; every record is a list, every constant something else
LIST, DICT, SET, FROZENSET, TUPLE, DEQUE, MAPPING, GLOBAL, DTYPE, ARRAY, TENSOR, USER, OBJ, DATED = range(14)
# what calling a global makes (the allowed globals' table says which is which, `unpickler.WALK_MAKES`)
(F_LIST, F_DICT, F_TUPLE, F_SET, F_FROZENSET, F_INT, F_FLOAT, F_STR, F_BOOL, F_BYTES) = range(10)
(M_BYTEARRAY, M_OBJ, M_ODICT, M_DDICT, M_COUNTER, M_DEQUE, M_DTYPE, M_ARRAY, M_TENSOR, M_STORAGE, M_USER) = range(
    10, 21
)
C_DATED, C_OBJ, C_USER, M_NOTHING = range(21, 25)  # classes (NEWOBJ takes only these), and ndarray's token
_CLASSES = (C_DATED, C_OBJ, C_USER)
_FACTORY_KINDS = {F_LIST: LIST, F_DICT: DICT, F_SET: SET, F_FROZENSET: FROZENSET}
_FACTORY_VALUES: dict[int, Any] = {F_TUPLE: (), F_INT: 0, F_FLOAT: 0.0, F_BOOL: False}


def limit_for(size: int, max_block_bytes: int) -> int:
    """The most a block of `size` decompressed bytes may build."""
    return min(AMPLIFICATION * size + FLOOR_BYTES, MAX_BLOCK_MULTIPLE * max_block_bytes)


class Refused(UnsafePickleError):
    """A block that builds what data never needs (a size, an iterable, a tuple nested a million deep...)."""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


STR, BYTES, BYTEARRAY, UNKNOWN_HASH, ABSENT = (
    _Marker(n) for n in ("STR", "BYTES", "BYTEARRAY", "UNKNOWN_HASH", "ABSENT")
)
# short str and bytes constants are kept as slices of the block (a module's name, a key's model)


def _refuse_depth(depth: int) -> None:
    raise Refused(
        f"its containers nest {depth:,} deep, past the {MAX_DEPTH:,} a pickler writes (CPython's hash and free of "
        f"such nesting overflow the C stack): read it only if you trust it (trusted=True)"
    )


def _refuse_tree(tree: int, bound: int) -> None:
    raise Refused(
        f"it shares containers so that walking it visits more than {bound:,} objects ({TREE_PER_BYTE} per byte of "
        f"the block): read it only if you trust it (trusted=True)"
    )


def _node(kind: int) -> list:
    return [kind, 1, 1, False, ()]


def _nest(parent: list, items: list, max_tree: int) -> bool:
    """Adds items to a container; True when the container was already inside another (its depth and size there
    are now stale: the walk recomputes them over the final graph) or is one of the items (a cycle)."""
    stale = parent[NESTED]
    depth, tree = parent[DEPTH], parent[TREE] + len(items)
    for item in items:
        if type(item) is list:
            if item[DEPTH] >= depth:
                depth = item[DEPTH] + 1
            tree += item[TREE] - 1
            item[NESTED] = True
            if item is parent:
                stale = True
    if parent[ITEMS]:
        parent[ITEMS] += items
    else:
        parent[ITEMS] = items  # the callers' lists are their own
    parent[DEPTH], parent[TREE] = depth, tree
    if depth > MAX_DEPTH:
        _refuse_depth(depth)
    if tree > max_tree:
        _refuse_tree(tree, max_tree)
    return stale


def _made(items: list, kind: int, max_tree: int) -> list:
    node = [kind, 1, 1, False, ()]
    _nest(node, items, max_tree)
    return node


def _final_graph(nodes: list, root: Any, tally: _Keys, max_tree: int) -> None:
    """Depth and size over the final graph, once a container changed after it was nested: strongly connected
    components (Tarjan's, iterative) count as deep as they have members; a numpy dtype in a cycle is refused (its
    hash recurses without end). Its own memory stays under what the walk charged for the nodes."""
    number: dict[int, int] = {}  # id of a node -> its number, by which the lists below are indexed
    low: list[int] = []
    depth: list[int] = []  # of each node's component, once weighed
    tree: list[int] = []
    on_path: list[bool] = []
    path: list = []
    for start in nodes:
        if id(start) in number:
            continue
        number[id(start)] = len(low)
        _grow(low, depth, tree, on_path)
        path.append(start)
        work = [(start, iter(start[ITEMS]))]
        while work:
            node, children = work[-1]
            here = number[id(node)]
            for child in children:
                if type(child) is not list:
                    continue
                seen = number.get(id(child))
                if seen is None:
                    number[id(child)] = len(low)
                    _grow(low, depth, tree, on_path)
                    path.append(child)
                    work.append((child, iter(child[ITEMS])))
                    break
                if on_path[seen] and seen < low[here]:
                    low[here] = seen
            else:
                work.pop()
                if work:
                    parent = number[id(work[-1][0])]
                    low[parent] = min(low[parent], low[here])
                if low[here] == here:
                    component = []
                    while True:
                        member = path.pop()
                        on_path[number[id(member)]] = False
                        component.append(member)
                        if member is node:
                            break
                    _weigh(component, number, depth, tree, max_tree)
    if type(root) is list and tree[number[id(root)]] > max_tree:
        _refuse_tree(tree[number[id(root)]], max_tree)
    if sum(tree[number[id(key)]] for key in tally.nodes) > tally.bound:
        raise Refused(f"hashing its keys would visit more than {tally.bound:,} objects: read it only if you trust it")


def _grow(low: list[int], depth: list[int], tree: list[int], on_path: list[bool]) -> None:
    low.append(len(low))
    depth.append(0)
    tree.append(0)
    on_path.append(True)


def _weigh(component: list, number: dict[int, int], depth: list[int], tree: list[int], max_tree: int) -> None:
    """Depth and size of one strongly connected component, every component it reaches weighed already."""
    members = {id(m) for m in component}
    deepest, size, cyclic = 0, 0, len(component) > 1
    for member in component:
        for item in member[ITEMS]:
            if type(item) is not list:
                size += 1
            elif id(item) in members:
                cyclic = True
            else:
                deepest = max(deepest, depth[number[id(item)]])
                size += tree[number[id(item)]]
        size += 1
    total = len(component) + deepest
    if total > MAX_DEPTH:
        _refuse_depth(total)
    if cyclic and any(m[KIND] == DTYPE for m in component):
        raise Refused("a numpy dtype in it holds itself (its hash would recurse without end): refused")
    size = min(size, max_tree + 1)
    for member in component:
        depth[number[id(member)]], tree[number[id(member)]] = total, size
