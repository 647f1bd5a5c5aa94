"""Event-time windows on keyed state and timers: tumbling, hopping and
session windows per user key, each with a user aggregate, emitted once when
the partition's watermark passes their end (and, optionally, early on every
batch that changes them). A record whose windows have all closed is a dead
letter of kind `late`, never dropped.

It keeps windows in state exactly as the Rust SDK's `sluice_plugin::window`
does (docs/event-time.md), so a windowed transform gives the same rows,
state and digest in either language:

- tumbling and hopping: the aggregate of window [start, end) of `key` under
  `sluice/w/` + end (8 bytes, big-endian, sign bit flipped) + `key`; a timer
  (`key`, end - 1) closes it;
- sessions: every open session of `key` under `sluice/s/` + `key`, per
  session its start and end (8 bytes each, big-endian) and its aggregate's
  length (4 bytes, big-endian) and bytes, in start order; a timer (`key`,
  end - 1) per session closes it.

    from sluice_plugin.window import Event, Rejected, Tumbling, Windowed, SUM

    def take(r):  # once per record; None or Rejected(reason): in no window
        p = r.json()
        return Event(key=p["user"], time_ms=p["ts"], input=p["cents"])

    windowed = Windowed(Tumbling(size_ms=60_000), SUM, early=False)
    windowed.run(batch, out, take,
        lambda out, w: out.row(t, w.key.decode(), w.start_ms, w.acc))

It must not read the host's clock or keep anything between batches outside
state.
"""

import struct
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from . import Batch, FiredTimer, Output, Record, State, due_timers

__all__ = [
    "Aggregate",
    "Event",
    "Hopping",
    "Rejected",
    "Session",
    "SUM",
    "Tumbling",
    "WindowValue",
    "Windowed",
]

_WINDOW_PREFIX = b"sluice/w/"
_SESSION_PREFIX = b"sluice/s/"
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Tumbling:
    """Back-to-back windows of `size_ms`, aligned to the Unix epoch."""

    size_ms: int


@dataclass(frozen=True)
class Hopping:
    """Windows of `size_ms` starting every `hop_ms`, aligned to the epoch."""

    size_ms: int
    hop_ms: int


@dataclass(frozen=True)
class Session:
    """Records of a key less than `gap_ms` apart, together: a session ends
    `gap_ms` after its last record."""

    gap_ms: int


class Aggregate:
    """What a window computes over its records. Values are immutable here:
    `add` and `merge` return the new value. `encode`/`decode` are how state
    keeps it (the same bytes as the other SDKs' accumulator)."""

    def init(self) -> Any:
        """The value of a window without records."""
        raise NotImplementedError

    def add(self, acc: Any, input: Any) -> Any:
        """`acc` with a record's input taken in."""
        raise NotImplementedError

    def merge(self, acc: Any, other: Any) -> Any:
        """Two sessions' values joined (sessions only)."""
        raise NotImplementedError

    def encode(self, acc: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Optional[Any]:
        """The value, or None if `data` is not one."""
        raise NotImplementedError


class _Sum(Aggregate):
    """The sum of the inputs, an int64 kept as 8 bytes big-endian (Rust's
    `i64` accumulator)."""

    def init(self):
        return 0

    def add(self, acc, input):
        return acc + input

    def merge(self, acc, other):
        return acc + other

    def encode(self, acc):
        return struct.pack(">q", acc)

    def decode(self, data):
        return struct.unpack(">q", data)[0] if len(data) == 8 else None


SUM = _Sum()


@dataclass(slots=True)
class Event:
    """A record goes into the windows of `key` (bytes or str) at `time_ms`
    (None: its Kafka timestamp), bringing `input` to their aggregates."""

    key: Any
    time_ms: Optional[int]
    input: Any


@dataclass(slots=True)
class Rejected:
    """A record in no window: a `rejected` dead letter with `reason`."""

    reason: str


@dataclass(slots=True)
class WindowValue:
    """A window's value, handed to the emit function; `emit` is "early" (the
    batch changed it, still open) or "final" (handed out once)."""

    topic: str
    partition: int
    key: bytes
    start_ms: int
    end_ms: int
    acc: Any
    emit: str
    state: State


def _ordered(at: int) -> bytes:
    return ((at & _U64) ^ (1 << 63)).to_bytes(8, "big")


def _window_key(end_ms: int, key: bytes) -> bytes:
    return _WINDOW_PREFIX + _ordered(end_ms) + key


def _read_sessions(state: State, key: bytes) -> List[list]:
    data = state.get(_SESSION_PREFIX + key) or b""
    sessions, at = [], 0
    while at + 20 <= len(data):
        start, end, length = struct.unpack_from(">qqI", data, at)
        sessions.append([start, end, data[at + 20 : at + 20 + length]])
        at += 20 + length
    return sessions


def _write_sessions(state: State, key: bytes, sessions: List[list]) -> None:
    if not sessions:
        state.delete(_SESSION_PREFIX + key)
        return
    state.set(
        _SESSION_PREFIX + key,
        b"".join(struct.pack(">qqI", s, e, len(a)) + a for s, e, a in sessions),
    )


class Windowed:
    """Windows of one kind with one aggregate."""

    def __init__(self, windows, aggregate: Aggregate, early: bool = False):
        self.windows = windows
        self.aggregate = aggregate
        self.early = early

    def run(
        self,
        batch: Batch,
        out: Output,
        take: Callable[[Record], Any],
        emit: Callable[[Output, WindowValue], None],
    ) -> None:
        """Runs a batch: `take` says once per record what it brings (an
        `Event`), or that it is in no window (None, or `Rejected`: either
        way it does not move the watermark, so a malformed record's Kafka
        timestamp cannot close windows). Each event goes into its windows,
        or becomes a `late` dead letter; then every window the watermark
        passed is handed to `emit` once, as final (and, with `early`, every
        other window the batch changed as early)."""
        touched = [] if self.early else None
        for record in batch:
            taken = take(record)
            if not isinstance(taken, Event):
                record.time().clear_event_time()
                if isinstance(taken, Rejected):
                    out.reject(record, taken.reason)
                continue
            key = taken.key.encode("utf-8") if isinstance(taken.key, str) else bytes(taken.key)
            if taken.time_ms is not None:
                time = int(taken.time_ms)
                record.time().set_event_time(time)
            else:
                time = record.timestamp
            watermark = record.time().watermark()
            if isinstance(self.windows, Session):
                added = self._add_to_session(record, key, time, taken.input, watermark, touched)
            else:
                added = self._add_to_windows(record, key, time, taken.input, watermark, touched)
            if not added:
                shown = "None" if watermark is None else f"Some({watermark})"
                record.time().late(
                    f"event time {time} is behind the watermark {shown}: its window has closed"
                )
        for timer in due_timers():
            self._close(batch, timer, out, emit)
        if touched is not None:
            self._emit_early(batch, touched, out, emit)

    def _windows_of(self, time: int) -> List[Tuple[int, int]]:
        size = self.windows.size_ms
        hop = self.windows.hop_ms if isinstance(self.windows, Hopping) else size
        start = time - time % hop
        windows = []
        while start > time - size:
            windows.append((start, start + size))
            start -= hop
        windows.reverse()
        return windows

    def _add_to_windows(self, record, key, time, input, watermark, touched) -> bool:
        state, agg = record.state(), self.aggregate
        added = False
        for _, end in self._windows_of(time):
            if watermark is not None and end - 1 <= watermark:
                continue
            at = _window_key(end, key)
            stored = state.get(at)
            if stored is None:
                record.time().set_timer(key, end - 1)
                acc = agg.init()
            else:
                acc = agg.decode(stored)
                if acc is None:
                    acc = agg.init()
            state.set(at, agg.encode(agg.add(acc, input)))
            if touched is not None:
                touched.append((record.index, record.topic, record.partition, key, end))
            added = True
        return added

    def _add_to_session(self, record, key, time, input, watermark, touched) -> bool:
        state, agg, gap = record.state(), self.aggregate, self.windows.gap_ms
        start, end = time, time + gap
        meets, apart = [], []
        for s in _read_sessions(state, key):
            # A session the watermark has passed is closed, though its timer
            # fires only at the batch's end: nothing joins it.
            is_open = watermark is None or s[1] - 1 > watermark
            (meets if is_open and s[0] < time + gap and time < s[1] else apart).append(s)
        for s in meets:
            start, end = min(start, s[0]), max(end, s[1])
        if watermark is not None and end - 1 <= watermark:
            return False
        acc = agg.add(agg.init(), input)
        for s in meets:
            if s[1] != end:
                record.time().delete_timer(key, s[1] - 1)
            other = agg.decode(s[2])
            if other is not None:
                acc = agg.merge(acc, other)
        record.time().set_timer(key, end - 1)
        sessions = apart + [[start, end, agg.encode(acc)]]
        sessions.sort(key=lambda s: s[0])
        _write_sessions(state, key, sessions)
        if touched is not None:
            touched.append((record.index, record.topic, record.partition, key, end))
        return True

    def _close(self, batch: Batch, timer: FiredTimer, out: Output, emit) -> None:
        state, end = timer.state(), timer.at_ms + 1
        if isinstance(self.windows, Session):
            sessions = _read_sessions(state, timer.key)
            found = next((i for i, s in enumerate(sessions) if s[1] == end), None)
            if found is None:
                return
            start, _, data = sessions.pop(found)
            _write_sessions(state, timer.key, sessions)
        else:
            at = _window_key(end, timer.key)
            data = state.get(at)
            if data is None:
                return
            state.delete(at)
            start = end - self.windows.size_ms
        acc = self.aggregate.decode(data)
        if acc is None:
            return
        topic, partition = batch.partition_of(timer.index) or ("", 0)
        emit(out, WindowValue(topic, partition, timer.key, start, end, acc, "final", state))

    def _emit_early(self, batch: Batch, touched, out: Output, emit) -> None:
        seen = set()
        for index, topic, partition, key, end in touched:
            if (topic, partition, key, end) in seen:
                continue
            seen.add((topic, partition, key, end))
            state = State(index)
            if isinstance(self.windows, Session):
                found = [s for s in _read_sessions(state, key) if s[1] == end]
                if not found:
                    continue
                start, data = found[0][0], found[0][2]
            else:
                data = state.get(_window_key(end, key))
                if data is None:
                    continue
                start = end - self.windows.size_ms
            acc = self.aggregate.decode(data)
            if acc is None:
                continue
            emit(out, WindowValue(topic, partition, key, start, end, acc, "early", state))
