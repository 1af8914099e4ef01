"""Arrow rows as plain Python values, the ones a reader with default settings unpickles.

pyarrow's `to_pylist` gives a `zoneinfo.ZoneInfo` for a timestamp with a time zone, a `pandas.Timestamp` or
`pandas.Timedelta` for nanoseconds (where pandas is installed), and cuts `time64[ns]` to microseconds without a
word. The first two are refused by the restricted unpickler, so a dataset converted from them would not open
with default settings; the third loses data. So before `to_pylist`, columns are cast:

- a timestamp with a time zone becomes one in UTC: a `datetime` with `datetime.timezone.utc`, the same instant
  (equal to the original under `==`); the zone's name stays in the source's schema only;
- nanoseconds (timestamp, duration, time of day) become microseconds, so `datetime`, `timedelta` and `time`,
  when no value of the column in the record batch has a fraction of a microsecond (what pandas writes from
  datetimes); otherwise int nanoseconds (since the epoch, of the duration, since midnight), for that column
  for the rest of the file: a column of one file never goes back to datetimes, and data with real nanoseconds
  is never cut.

Nested columns (lists, structs, maps of these) are cast the same way, inside.
"""

from __future__ import annotations

from typing import Any


def plain_type(pyarrow: Any, kind: Any, exact: bool) -> Any:
    """The type a column of `kind` is cast to (`exact`: its nanoseconds, if any, are whole microseconds)."""
    types = pyarrow.types
    if types.is_timestamp(kind):
        tz = "+00:00" if kind.tz else None
        if kind.unit == "ns":
            return pyarrow.timestamp("us", tz) if exact else pyarrow.int64()
        return pyarrow.timestamp(kind.unit, tz)
    if types.is_duration(kind) and kind.unit == "ns":
        return pyarrow.duration("us") if exact else pyarrow.int64()
    if types.is_time64(kind) and kind.unit == "ns":
        return pyarrow.time64("us") if exact else pyarrow.int64()
    if types.is_list(kind) or types.is_large_list(kind):
        item = kind.value_field.with_type(plain_type(pyarrow, kind.value_type, exact))
        return pyarrow.list_(item) if types.is_list(kind) else pyarrow.large_list(item)
    if types.is_fixed_size_list(kind):
        return pyarrow.list_(kind.value_field.with_type(plain_type(pyarrow, kind.value_type, exact)), kind.list_size)
    if types.is_struct(kind):
        return pyarrow.struct([field.with_type(plain_type(pyarrow, field.type, exact)) for field in kind])
    if types.is_map(kind):
        return pyarrow.map_(
            kind.key_field.with_type(plain_type(pyarrow, kind.key_type, exact)),
            kind.item_field.with_type(plain_type(pyarrow, kind.item_type, exact)),
        )
    return kind


class PlainRows:
    """Record batches of one file as lists of dicts of plain values (see the module); remembers which columns
    have gone to int nanoseconds."""

    def __init__(self, pyarrow: Any) -> None:
        self.pyarrow = pyarrow
        self.in_nanoseconds: set[str] = set()
        self._schema: Any = None
        self._casts: list[bool] = []  # for each column of the schema: whether it is cast at all

    def __call__(self, batch: Any) -> list[dict[str, Any]]:
        if batch.schema is not self._schema and batch.schema != self._schema:
            self._schema = batch.schema
            self._casts = [plain_type(self.pyarrow, field.type, True) != field.type for field in batch.schema]
        if not any(self._casts):
            return batch.to_pylist()
        columns = [
            self._cast(name, column) if cast else column
            for name, column, cast in zip(batch.schema.names, batch.columns, self._casts)
        ]
        return self.pyarrow.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()

    def _cast(self, name: str, column: Any) -> Any:
        if name not in self.in_nanoseconds:
            try:
                return column.cast(plain_type(self.pyarrow, column.type, True))  # safe: refuses to cut a value
            except self.pyarrow.ArrowInvalid:
                self.in_nanoseconds.add(name)
        return column.cast(plain_type(self.pyarrow, column.type, False))
