"""Map functions for importers/test_tables.py: workers import them by name, so they live in a module of their own."""

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
    """A conversion that takes a while (1 ms an example), to interrupt; at full speed where ATLAS_TEST_SLOWLY=0
    (the same map, so that a resumed run takes up the interrupted one, without waiting)."""
    import os
    import time

    if os.environ.get("ATLAS_TEST_SLOWLY") != "0":
        time.sleep(0.001)
    return example


def a_record_at_three(example: dict) -> object:
    """Example 3 becomes a user's own class, which readers with default settings refuse."""
    return Record(example["i"]) if example["i"] == 3 else example


def rows_of(n: int):
    """build()'s function: input n yields n * 3 examples."""
    for i in range(n * 3):
        yield {"input": n, "i": i, "text": "word " * (i % 5)}


def rows_failing_at(n: int):
    """As rows_of, but input 2 fails after its fourth example."""
    for i in range(n * 3):
        if n == 2 and i == 4:
            raise RuntimeError("the source went away")
        yield {"input": n, "i": i}


def a_dict_not_examples(n: int) -> dict:
    return {"input": n}
