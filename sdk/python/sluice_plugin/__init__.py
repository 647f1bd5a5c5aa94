"""The Python SDK for sluice transforms.

Owns the guest side of the `sluice:plugin` world for Python: it hides the
columnar batch layout behind an iterator of `Record`s and the columnar output
layout behind a row builder, so a transform is a class with `process`:

    from sluice_plugin import Transform, export

    class Upper(Transform):
        def process(self, batch, out):
            t = out.target("upper", value="text")
            for r in batch:
                out.row(t, value=(r.value or b"").decode().upper())

    WitWorld = export(Upper)

Build it with `sluice build` (componentize-py). It must not reach outside
the world: the host gives the module a fixed clock (the batch time), seeded
random, no files and no network, so the same batch gives the same output on
every run.
"""

import json
import re
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.imports import log as _log
from wit_world.imports import state as _state
from wit_world.imports import time as _time
from wit_world.imports import types as _wit

__all__ = [
    "BatchError",
    "Batch",
    "Context",
    "FiredTimer",
    "Output",
    "Record",
    "State",
    "Time",
    "Transform",
    "due_timers",
    "export",
    "log",
]

# Column kinds, as declared in `out.target(...)`.
KINDS = ("int64", "float64", "text", "bytes", "bool")


class BatchError(Exception):
    """Fails the whole batch (not a trap). `retryable=True` when running the
    same batch again may succeed."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class log:
    """Deterministic logging, buffered by the host per batch."""

    @staticmethod
    def debug(message: str) -> None:
        _log.write(_log.Level.DEBUG, message)

    @staticmethod
    def info(message: str) -> None:
        _log.write(_log.Level.INFO, message)

    @staticmethod
    def warn(message: str) -> None:
        _log.write(_log.Level.WARN, message)

    @staticmethod
    def error(message: str) -> None:
        _log.write(_log.Level.ERROR, message)


@dataclass(frozen=True)
class Context:
    """Where and when the batch runs; every field comes from the plan."""

    pipeline: str
    batch_id: str
    batch_time_ms: int
    seed: int


@dataclass(slots=True)
class Record:
    """One input record. `key` and `value` are bytes or None."""

    index: int
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: List[Tuple[str, Optional[bytes]]]

    def json(self):
        """The value parsed as strict JSON, from strict UTF-8 (raises
        ValueError when it is not: NaN and Infinity literals, nesting deeper
        than 127 arrays and objects, and lone surrogate escapes included)."""
        if self.value is None:
            raise ValueError("value is null")
        text = self.value.decode("utf-8")
        _check_json(self.value, text)
        return json.loads(text, parse_constant=_no_constant)

    def text(self) -> str:
        """The value as UTF-8 text ('' when null; bad bytes replaced)."""
        return "" if self.value is None else self.value.decode("utf-8", "replace")

    def state(self) -> "State":
        """The keyed state of the partition this record came from."""
        return State(self.index)

    def time(self) -> "Time":
        """Event time of the partition this record came from."""
        return Time(self.index)


class Time:
    """Event time of one input partition, as a record (or a fired timer)
    names it. A partition's watermark is the highest event time of its
    records so far minus `event_time.allowed_lateness_ms`, kept in its state
    by the host; a timer comes due once the watermark reaches its time, in
    the batch that moved it there (`due_timers`)."""

    __slots__ = ("_index",)

    def __init__(self, index: int):
        self._index = index

    def watermark(self) -> Optional[int]:
        """The partition's watermark just before this record (ms since the
        epoch): as the batch started, moved by the partition's records
        before it; None before its first record."""
        return _time.watermark(self._index)

    def set_event_time(self, time_ms: int) -> None:
        """Sets this record's event time (default: its Kafka timestamp).
        Call it (or `clear_event_time`) in record order, before `watermark`
        of later records and before `due_timers`."""
        _time.set_record_time(self._index, int(time_ms))

    def clear_event_time(self) -> None:
        """Leaves this record out of the watermark: it has no event time (a
        record no window takes: no key, not parseable)."""
        _time.set_record_time(self._index, None)

    def set_timer(self, key, at_ms: int) -> None:
        """Sets the timer (`key`, `at_ms`) on the partition (`key` at most
        245 bytes); setting it again is one timer (and empties its value)."""
        _time.set_timer(self._index, _key(key), int(at_ms))

    def set_timer_value(self, key, at_ms: int, value: bytes) -> None:
        """Sets the timer (`key`, `at_ms`) keeping `value` with it (bounded
        like a state value), handed back in `FiredTimer.value`: state that
        lives as long as the timer, one stored entry where a state key and
        a timer would take two. Setting it again replaces the value."""
        _time.set_timer_value(self._index, _key(key), int(at_ms), bytes(value))

    def timer_value(self, key, at_ms: int) -> Optional[bytes]:
        """The value kept with the timer (`key`, `at_ms`): None if there is
        no such timer (never set, deleted, fired), b"" if it was set by
        `set_timer`."""
        value = _time.timer_value(self._index, _key(key), int(at_ms))
        return None if value is None else bytes(value)

    def delete_timer(self, key, at_ms: int) -> None:
        """Removes the timer (`key`, `at_ms`) of the partition."""
        _time.delete_timer(self._index, _key(key), int(at_ms))

    def late(self, reason: str) -> None:
        """Makes the record a dead letter of kind `late` with `reason`."""
        _time.late(self._index, reason)


@dataclass(slots=True)
class FiredTimer:
    """A timer that came due; `index` names its partition."""

    index: int
    key: bytes
    at_ms: int
    # What `Time.set_timer_value` kept with it (b"" for `set_timer`).
    value: bytes = b""

    def state(self) -> "State":
        """The keyed state of the timer's partition."""
        return State(self.index)

    def time(self) -> Time:
        """Event time of the timer's partition."""
        return Time(self.index)


def due_timers() -> List[FiredTimer]:
    """Moves each partition's watermark past the batch's records and returns
    the timers that came due by it, oldest first, each once (they are
    removed as they are returned). What the module writes and emits for
    them commits with this batch."""
    return [
        FiredTimer(t.index, bytes(t.key), t.at_ms, bytes(t.value))
        for t in _time.due_timers_with_values()
    ]


_I64 = (-(1 << 63), (1 << 63) - 1)
_INTEGER = re.compile(rb"-?[0-9]+")


def _key(key) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else bytes(key)


class State:
    """Keyed state of one input partition, as a record sees it: the state as
    the batch started plus the batch's own earlier writes. The host commits
    what the batch writes with its rows and offsets, exactly once, and
    replays it in `sluice verify`. Keys (bytes, or str as UTF-8) are at most
    255 bytes; values at most `limits.max_state_value_kib`.

    The typed helpers store integers as their decimal text and strings as
    UTF-8: the same bytes in every SDK."""

    __slots__ = ("_index",)

    def __init__(self, index: int):
        self._index = index

    def get(self, key) -> Optional[bytes]:
        """The value under `key`, or None if absent or expired."""
        return _state.get(self._index, _key(key))

    def set(self, key, value: bytes) -> None:
        """Stores `value` under `key`."""
        _state.set(self._index, _key(key), bytes(value), None)

    def set_expiring(self, key, value: bytes, expires_at_ms: int) -> None:
        """Stores `value` under `key` until `expires_at_ms` (ms since the
        epoch): batches whose batch time is at or past it read it as absent.
        Expiry follows batch time (`batch.context.batch_time_ms`) or a time
        the module computes (a record's timestamp), never the host's clock."""
        _state.set(self._index, _key(key), bytes(value), int(expires_at_ms))

    def delete(self, key) -> None:
        """Removes `key`."""
        _state.delete(self._index, _key(key))

    def get_int(self, key) -> Optional[int]:
        """The integer under `key` (decimal text: an optional `-` then
        digits, in the int64 range); None if absent or anything else."""
        value = self.get(key)
        if value is None or not _INTEGER.fullmatch(value):
            return None
        n = int(value)
        return n if _I64[0] <= n <= _I64[1] else None

    def set_int(self, key, value: int) -> None:
        """Stores `value` (an int64) under `key` as decimal text."""
        if not isinstance(value, int) or not _I64[0] <= value <= _I64[1]:
            raise ValueError(f"{value!r} is not an int64")
        self.set(key, str(value).encode("ascii"))

    def get_str(self, key) -> Optional[str]:
        """The text under `key`; None if absent or not UTF-8."""
        value = self.get(key)
        if value is None:
            return None
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def set_str(self, key, value: str) -> None:
        """Stores `value` under `key` as UTF-8."""
        self.set(key, value.encode("utf-8"))


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


# Every SDK's JSON helper refuses what Rust's serde_json refuses beyond
# RFC 8259 (docs/languages.md): more than this many nested arrays and
# objects (a deeper value would exhaust the module's stack), and a \u
# escape of half a surrogate pair (it has no UTF-8 encoding).
MAX_JSON_DEPTH = 127


def _check_json(raw: bytes, text: str) -> None:
    # The exact scan runs only when a cheap count says it may find something.
    deep = raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
    if deep or b"\\u" in raw:
        _scan_json(text)


def _scan_json(text: str) -> None:
    depth, i, n, in_string = 0, 0, len(text), False
    while i < n:
        c = text[i]
        if in_string:
            if c == "\\":
                if text[i + 1 : i + 2] == "u":
                    i += _surrogates(text, i)
                    continue
                i += 2
                continue
            in_string = c != '"'
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        elif c in "]}":
            depth -= 1
        i += 1


def _hex4(text: str, at: int) -> int:
    try:
        return int(text[at : at + 4], 16) if len(text[at : at + 4]) == 4 else -1
    except ValueError:
        return -1  # not an escape: json.loads says so


def _surrogates(text: str, i: int) -> int:
    """Checks the \\u escape at `i`; returns its length (a pair: both)."""
    unit = _hex4(text, i + 2)
    if 0xDC00 <= unit <= 0xDFFF:
        raise ValueError(f"lone surrogate escape \\u{unit:04x} in JSON")
    if 0xD800 <= unit <= 0xDBFF:
        low = _hex4(text, i + 8) if text[i + 6 : i + 8] == "\\u" else -1
        if not 0xDC00 <= low <= 0xDFFF:
            raise ValueError(f"lone surrogate escape \\u{unit:04x} in JSON")
        return 12
    return 6


class Batch:
    """A batch of records, iterated in order."""

    def __init__(self, ctx, raw):
        self.context = Context(ctx.pipeline, ctx.batch_id, ctx.batch_time_ms, ctx.seed)
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw.offsets)

    def partition_of(self, index: int) -> Optional[Tuple[str, int]]:
        """The (topic, partition) of record `index` (or a timer's index)."""
        for s in self._raw.slices:
            if s.first <= index < s.first + s.count:
                return (s.topic, s.partition)
        return None

    def __iter__(self) -> Iterator[Record]:
        raw = self._raw
        key_at = value_at = name_at = header_value_at = header_at = 0
        for s in raw.slices:
            for i in range(s.first, s.first + s.count):
                key, key_at = _take(raw.keys, raw.key_lengths[i], key_at)
                value, value_at = _take(raw.values, raw.value_lengths[i], value_at)
                headers = []
                count = raw.header_counts[i]
                for h in range(header_at, header_at + count):
                    n = raw.header_name_lengths[h]
                    name = raw.header_names[name_at : name_at + n].decode("utf-8", "replace")
                    name_at += n
                    hv, header_value_at = _take(
                        raw.header_values, raw.header_value_lengths[h], header_value_at
                    )
                    headers.append((name, hv))
                header_at += count
                yield Record(
                    i, s.topic, s.partition, raw.offsets[i], raw.timestamps[i], key, value, headers
                )


def _take(data: bytes, length: int, at: int):
    if length < 0:
        return None, at
    return bytes(data[at : at + length]), at + length


class _Target:
    # Rows are kept row after row in one flat list (one `extend` per row,
    # in C) and cut into columns once, when the batch's output is made.
    __slots__ = ("name", "names", "known", "kinds", "width", "flat", "rows")

    def __init__(self, name: str, columns):
        self.name = name
        self.names = [c for c, _ in columns]
        self.known = frozenset(self.names)
        self.kinds = [k for _, k in columns]
        self.width = len(self.names)
        self.flat = []
        self.rows = 0

    def columns(self):
        """Each column's values, in declared order."""
        return [self.flat[i :: self.width] for i in range(self.width)]


class Output:
    """The rows of a batch, by target, and its rejected records."""

    def __init__(self):
        self._targets = []
        self._by_name = {}
        self._rejections = []

    def target(self, name: str, **columns: str) -> int:
        """Declares target `name` with its columns and their kinds (one of
        int64, float64, text, bytes, bool), in order; returns its handle.
        Declaring the same target again returns the same handle."""
        if name in self._by_name:
            return self._by_name[name]
        for column, kind in columns.items():
            if kind not in KINDS:
                raise ValueError(f"column {column!r}: kind {kind!r} is not one of {KINDS}")
        self._targets.append(_Target(name, list(columns.items())))
        self._by_name[name] = len(self._targets) - 1
        return self._by_name[name]

    def row(self, target: int, *values, **named) -> None:
        """Adds a row: values in declared order, or by column name. None is
        null."""
        t = self._targets[target]
        if named:
            # Every column named (the common case): no set arithmetic.
            if len(named) == len(t.names) and t.known.issuperset(named):
                values = [named[n] for n in t.names]
            else:
                unknown = named.keys() - t.known
                if unknown:
                    raise ValueError(f"target {t.name!r} has no column {sorted(unknown)[0]!r}")
                values = [named.get(n) for n in t.names]
        if len(values) != t.width:
            raise ValueError(f"target {t.name!r} takes {t.width} values, got {len(values)}")
        t.flat.extend(values)
        t.rows += 1

    def reject(self, record: Record, reason: str) -> None:
        """Makes `record` a dead letter with `reason`."""
        self._rejections.append(_wit.Rejection(record.index, reason))

    def _to_wit(self):
        targets = [
            _wit.TargetRows(
                t.name,
                t.rows,
                [_column(n, k, v) for n, k, v in zip(t.names, t.kinds, t.columns())],
            )
            for t in self._targets
        ]
        return _wit.Output(targets, self._rejections)


def _column(name: str, kind: str, values: list):
    # A column without nulls (the common case) is converted by map, in C.
    has_nulls = None in values
    nulls = bytes(1 if v is None else 0 for v in values) if has_nulls else b""
    if kind == "int64":
        ints = [0 if v is None else int(v) for v in values] if has_nulls else list(map(int, values))
        data = _wit.ColumnData_Int64(ints)
    elif kind == "float64":
        floats = (
            [0.0 if v is None else float(v) for v in values]
            if has_nulls
            else list(map(float, values))
        )
        data = _wit.ColumnData_Float64(floats)
    elif kind == "bool":
        data = _wit.ColumnData_Boolean(bytes(map(bool, values)))
    else:
        try:
            # All text (the common case of a text column): encoded in C.
            encoded = list(map(str.encode, values))
        except TypeError:
            encoded = [
                b"" if v is None else (v.encode() if isinstance(v, str) else bytes(v))
                for v in values
            ]
        var = _wit.VarColumn(list(map(len, encoded)), b"".join(encoded))
        data = _wit.ColumnData_Text(var) if kind == "text" else _wit.ColumnData_Bytes(var)
    return _wit.Column(name, nulls, data)


class Transform:
    """What a transform implements. One instance is made per batch, from the
    pipeline's params (a dict parsed from its JSON)."""

    def __init__(self, params: dict):
        self.params = params

    def process(self, batch: Batch, out: Output) -> None:
        raise NotImplementedError


def export(transform_class):
    """Makes the `WitWorld` class componentize-py exports, around
    `transform_class`: `WitWorld = export(MyTransform)`."""

    class World(wit_world.WitWorld):
        _instance = None

        def init(self, params: str) -> None:
            try:
                parsed = json.loads(params) if params else {}
                World._instance = transform_class(parsed)
            except BatchError as e:
                raise Err(e.message)
            except Exception as e:  # the user's message, not a trap
                raise Err(f"{type(e).__name__}: {e}")

        def process(self, ctx, batch):
            out = Output()
            try:
                World._instance.process(Batch(ctx, batch), out)
            except BatchError as e:
                raise Err(_wit.BatchError(e.message, e.retryable))
            return out._to_wit()

    return World
