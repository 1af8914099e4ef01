"""What docs/architecture.md says of the code, held against the code: each module row's line count (`wc -l`), and
the floors of its tree (an import from a floor to a higher one, or between two packages of one floor, is named).
`python .ci/doc_figures.py` rewrites the counts; `--check` (CI) fails, naming the rows and imports, if any is wrong."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
FLOOR = re.compile(r"^  (?P<names>[\w./, ]+?)\s{2,}.*floor (?P<floor>\d+)$", re.MULTILINE)
ROW = re.compile(r"^\| `(?P<module>[\w/]+\.py)` \| (?P<lines>\d+) \|", re.MULTILINE)


def lines_of(module: str) -> int | None:
    path = ROOT / "atlas_remote" / module
    return len(path.read_text().splitlines()) if path.is_file() else None


def floors(text: str) -> dict[str, int]:
    """Each subpackage or top module of the tree the doc draws, with its floor."""
    found: dict[str, int] = {}
    for match in FLOOR.finditer(text):
        for name in match["names"].split(","):
            found[name.strip().removesuffix("/").removesuffix(".py")] = int(match["floor"])
    return found


def climbs(floor_of: dict[str, int]) -> list[str]:
    """Imports (lazy ones included) that run up the floors, or across two packages of one floor."""
    package = ROOT / "atlas_remote"
    wrong = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts == ("__init__",):
            continue  # the public face imports from every floor
        room = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            here = parts[:-1]
            target = [*here[: len(here) - node.level + 1], *(node.module or "").split(".")]
            target = [t for t in target if t]
            if not target:
                continue  # the package itself (its face)
            other = target[0]
            if other == room or other not in floor_of or room not in floor_of:
                continue
            if floor_of[other] >= floor_of[room]:
                wrong.append(
                    f"atlas_remote/{path.relative_to(package)}:{node.lineno} imports {'.'.join(target)}: floor {floor_of[room]} -> {floor_of[other]}"
                )
    return wrong


def main() -> int:
    text = DOC.read_text()
    wrong: list[str] = []

    def fixed(match: re.Match) -> str:
        actual = lines_of(match["module"])
        if actual is None:
            wrong.append(f"{match['module']}: no such file")
            return match[0]
        if actual == int(match["lines"]):
            return match[0]
        wrong.append(f"{match['module']}: {match['lines']} in the doc, {actual} in the file")
        return match[0].replace(f"| {match['lines']} |", f"| {actual} |")

    new = ROW.sub(fixed, text)
    if "--check" in sys.argv:
        for row in wrong:
            print(f"docs/architecture.md: {row} (run python .ci/doc_figures.py)")
        upward = climbs(floors(text))
        for line in upward:
            print(f"{line} (docs/architecture.md's tree: imports run down its floors)")
        return 1 if wrong or upward else 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
