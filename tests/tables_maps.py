"""Map functions for test_tables.py: workers import them by name, so they live in a module of their own."""

from __future__ import annotations


def double_the_even(example: dict) -> list | None:
    """Odd rows dropped (None), even ones given twice (a list)."""
    if example["i"] % 2:
        return None
    return [{**example, "copy": 0}, {**example, "copy": 1}]


def fail_on_seven(example: dict) -> dict:
    if example["i"] == 7:
        raise ValueError("seven is not allowed")
    return example


class Record:
    """A user's own class in a block: refused unless allowed."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Record({self.n})"


def slowly(example: dict) -> dict:
    """A conversion that takes a while (1 ms an example), to interrupt."""
    import time

    time.sleep(0.001)
    return example
