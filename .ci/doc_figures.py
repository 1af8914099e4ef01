"""The figures docs/architecture.md gives of the code, from the code: each module row's line count (`wc -l`).
`python .ci/doc_figures.py` rewrites them; `--check` (CI) fails, naming the rows, if any is not the file's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(?P<module>[\w/]+\.py)` \| (?P<lines>\d+) \|", re.MULTILINE)


def lines_of(module: str) -> int | None:
    path = ROOT / "atlas_remote" / module
    return len(path.read_text().splitlines()) if path.is_file() else None


def main() -> int:
    text = DOC.read_text()
    wrong: list[str] = []

    def fixed(match: re.Match) -> str:
        actual = lines_of(match["module"])
        if actual is None or actual == int(match["lines"]):
            return match[0]
        wrong.append(f"{match['module']}: {match['lines']} in the doc, {actual} in the file")
        return match[0].replace(f"| {match['lines']} |", f"| {actual} |")

    new = ROW.sub(fixed, text)
    if "--check" in sys.argv:
        for row in wrong:
            print(f"docs/architecture.md: {row} (run python .ci/doc_figures.py)")
        return 1 if wrong else 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
