"""Event-time windows on keyed state and timers: tumbling, hopping and
session windows per user key, each with a user aggregate, emitted once when
the partition's watermark passes their end (and, optionally, early on every
batch that changes them). A record whose windows have all closed is a dead
letter of kind `late`, never dropped, or, with `retain_ms`, updates a window
that closed less than that ago (handed out again as "update").

It keeps windows in state exactly as the Rust SDK's `sluice_plugin::window`
does (docs/event-time.md), so a windowed transform gives the same rows,
state and digest in either language:

- tumbling and hopping: the timer (`key`, end - 1) closes window [start,
  end) of `key` and keeps its aggregate as its value, after a tag byte 1. A
  timer with an empty value holds no window (a retention's) or one opened
  before timer values, under `sluice/w/` + end (8 bytes, big-endian, sign
  bit flipped) + `key`: read from there, moved into the timer on its next
  change;
- sessions: every open session of `key` under `sluice/s/` + `key`, per
  session its start and end (8 bytes each, big-endian) and its aggregate's
  length (4 bytes, big-endian) and bytes, in start order; a timer (`key`,
  end - 1) per session closes it;
- with a retention R: a closed window's aggregate under `sluice/r/` + end +
  `key`, a closed session under `sluice/t/` + `key` (the layout of open
  ones); a timer (`key`, end - 1 + R) forgets it (set without a value,
  unless that timer exists already: it may hold a window).

    from sluice_plugin.window import Event, Rejected, Tumbling, Windowed, SUM

    def take(r):  # once per record; None or Rejected(reason): in no window
        p = r.json()
        return Event(key=p["user"], time_ms=p["ts"], input=p["cents"])

    windowed = Windowed(Tumbling(size_ms=60_000), SUM, early=False)
    windowed.run(batch, out, take,
        lambda out, w: out.row(t, w.key.decode(), w.start_ms, w.acc))

What it costs a record: a host call for its event time; the host's
watermark only when one of its windows may have closed (`_Watermark`); a
tumbling or hopping window is read from its timer and written back once a
batch (`_Held`), whatever the number of its records.

It must not read the host's clock or keep anything between batches outside
state.
"""

import struct
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from . import Batch, FiredTimer, Output, Record, State, Time, due_timers

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
_RETAINED_PREFIX = b"sluice/r/"
_RETAINED_SESSION_PREFIX = b"sluice/t/"
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
    keeps it (the same bytes as the other SDKs' accumulator); `decode` must
    give back what `encode` was given: a batch keeps each window's value in
    memory and state keeps its bytes between batches, so a value that does
    not survive the round trip would depend on where batches end."""

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
    batch changed it, still open), "final" (handed out once) or "update"
    (late records changed it after it closed, with `retain_ms`)."""

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


_WINDOW_TAG = b"\x01"


def _window_in(state: State, value: bytes, key: bytes, end: int, take: bool) -> Optional[bytes]:
    """The aggregate of `key`'s window ending at `end` kept by its closing
    timer's `value` or, for a window opened before timer values, under its
    old key (removed when `take`, as its timer is about to hold it)."""
    if value[:1] == _WINDOW_TAG:
        return value[1:]
    at = _window_key(end, key)
    data = state.get(at)
    if data is not None and take:
        state.delete(at)
    return data


def _open_window(state: State, time, key: bytes, end: int, take: bool) -> Optional[bytes]:
    """The aggregate of `key`'s open window ending at `end`: None if no
    timer closes one there."""
    value = time.timer_value(key, end - 1)
    return None if value is None else _window_in(state, value, key, end, take)


def _set_bare_timer(time, key: bytes, at_ms: int) -> None:
    """Sets a timer without a value (a retention's), unless the timer
    exists: it may hold a window, and fires at the same time anyway."""
    if time.timer_value(key, at_ms) is None:
        time.set_timer(key, at_ms)


def _retained_key(end_ms: int, key: bytes) -> bytes:
    return _RETAINED_PREFIX + _ordered(end_ms) + key


def _read_sessions(state: State, at: bytes) -> List[list]:
    """The sessions under `at` (an open or a retained sessions key)."""
    data = state.get(at) or b""
    sessions, at = [], 0
    while at + 20 <= len(data):
        start, end, length = struct.unpack_from(">qqI", data, at)
        sessions.append([start, end, data[at + 20 : at + 20 + length]])
        at += 20 + length
    return sessions


def _write_sessions(state: State, at: bytes, sessions: List[list]) -> None:
    if not sessions:
        state.delete(at)
        return
    state.set(
        at,
        b"".join(struct.pack(">qqI", s, e, len(a)) + a for s, e, a in sessions),
    )


_UNKNOWN = object()


class _Watermark:
    """A partition's watermark just before a record, asked of the host only
    when a window's fate depends on it. Its ceiling is the higher of the
    watermark the host told for one of the partition's records in the batch
    and the event times of its records since: the watermark (highest event
    time minus a lateness never negative, never falling) is at most that, so
    a window whose last millisecond is past it is open for sure."""

    __slots__ = ("_time", "_at_most", "_told")

    def __init__(self, time: Time, at_most):
        self._time, self._at_most, self._told = time, at_most, _UNKNOWN

    def get(self) -> Optional[int]:
        if self._told is _UNKNOWN:
            self._told = self._time.watermark()
        return self._told

    def reached(self, at_ms: int) -> bool:
        """Whether the watermark has reached `at_ms` (a window's last
        millisecond): the window has closed."""
        ceiling = self._at_most
        if ceiling is not _UNKNOWN and (ceiling is None or at_ms > ceiling):
            return False
        watermark = self.get()
        return watermark is not None and at_ms <= watermark

    def ceiling_after(self, time_ms: int):
        """The ceiling for the partition's next record, after this one at
        `time_ms`."""
        known = self._at_most if self._told is _UNKNOWN else self._told
        if known is _UNKNOWN:
            return _UNKNOWN
        return time_ms if known is None else max(known, time_ms)


class _Held:
    """The open tumbling and hopping windows a batch adds records to, held
    (their aggregates as values) until the batch's end: each is read from its
    closing timer once and written back to it once, in the order first read,
    however many of the batch's records it takes. The host keeps a timer's
    last value, so what the batch commits is the same. Written back before
    the batch asks for its due timers; a window a late record closes is let
    go (`take`)."""

    __slots__ = ("windows",)

    def __init__(self):
        # (topic, partition, key, end) -> [index of a record of its
        # partition, aggregate]
        self.windows = {}

    def get(self, record, key: bytes, end: int, read: Callable[[], Any]) -> list:
        at = (record.topic, record.partition, key, end)
        held = self.windows.get(at)
        if held is None:
            held = self.windows[at] = [record.index, read()]
        return held

    def take(self, record, key: bytes, end: int) -> Optional[list]:
        return self.windows.pop((record.topic, record.partition, key, end), None)

    def write_back(self, encode: Callable[[Any], bytes]) -> None:
        for (_, _, key, end), (index, acc) in self.windows.items():
            Time(index).set_timer_value(key, end - 1, _WINDOW_TAG + encode(acc))
        self.windows = {}


class _Pending:
    """What a batch's records leave to write and hand out at its end: the
    open windows it changed (held; and listed, with early rows), the final
    values of windows a late record reached before their timer closed them,
    and the closed windows late records updated."""

    __slots__ = ("held", "early", "closed", "updated")

    def __init__(self, early: bool):
        self.held = _Held()
        self.early = [] if early else None
        self.closed = []
        self.updated = []


class Windowed:
    """Windows of one kind with one aggregate. With `retain_ms`, a closed
    window takes late records that long more (event time): a record behind
    the watermark whose window ended less than `retain_ms` before it updates
    the window, handed out again as "update" once per batch, instead of
    becoming a `late` dead letter; a closed session only if the record's
    time is within its records (first to last), so its bounds never move."""

    def __init__(self, windows, aggregate: Aggregate, early: bool = False, retain_ms: int = 0):
        self.windows = windows
        self.aggregate = aggregate
        self.early = early
        self.retain_ms = max(int(retain_ms), 0)

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
        or updates retained ones, or becomes a `late` dead letter; then every
        window the watermark passed is handed to `emit` once, as final,
        every retained window late records changed as "update" (and, with
        `early`, every open window the batch changed as early)."""
        pending = _Pending(self.early)
        ceilings = {}
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
            partition = (record.topic, record.partition)
            watermark = _Watermark(record.time(), ceilings.get(partition, _UNKNOWN))
            if isinstance(self.windows, Session):
                added = self._add_to_session(
                    record, key, time, taken.input, watermark.get(), pending
                )
            else:
                added = self._add_to_windows(record, key, time, taken.input, watermark, pending)
            if not added:
                shown = "None" if watermark.get() is None else f"Some({watermark.get()})"
                record.time().late(
                    f"event time {time} is behind the watermark {shown}: its window has closed"
                )
            ceilings[partition] = watermark.ceiling_after(time)
        pending.held.write_back(self.aggregate.encode)
        fired = due_timers()
        for index, key, start, end, data in pending.closed:
            self._hand_out(batch, out, emit, index, key, start, end, data, "final")
        # Before the timers: one may forget a window this batch updated.
        self._emit_changed(batch, pending.updated, "update", out, emit)
        for timer in fired:
            self._close(batch, timer, out, emit)
        if pending.early is not None:
            self._emit_changed(batch, pending.early, "early", out, emit)

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

    def _retained(self, end: int, watermark: Optional[int]) -> bool:
        """Whether a window ending at `end`, closed by `watermark`, still
        takes late records."""
        return self.retain_ms > 0 and watermark is not None and end - 1 + self.retain_ms > watermark

    def _decode(self, data: Optional[bytes]) -> Any:
        acc = None if data is None else self.aggregate.decode(data)
        return self.aggregate.init() if acc is None else acc

    def _add_to_windows(self, record, key, time, input, watermark, pending) -> bool:
        state, timers, agg = record.state(), record.time(), self.aggregate
        added = False
        for start, end in self._windows_of(time):
            if watermark.reached(end - 1):
                closed = self._update_closed_window(
                    record, key, start, end, input, watermark.get(), pending
                )
                added = added or closed
                continue
            held = pending.held.get(
                record, key, end,
                lambda: self._decode(_open_window(state, timers, key, end, True)),
            )
            held[1] = agg.add(held[1], input)
            if pending.early is not None:
                pending.early.append((record.index, record.topic, record.partition, key, end))
            added = True
        return added

    def _update_closed_window(self, record, key, start, end, input, watermark, pending) -> bool:
        """Adds a late record to the closed window [start, end) if it is
        retained (closing it first if its timer has not yet)."""
        if not self._retained(end, watermark):
            return False
        state = record.state()
        at = _retained_key(end, key)
        data = state.get(at)
        if data is None:
            time = record.time()
            held = pending.held.take(record, key, end)
            if held is not None:
                data = self.aggregate.encode(held[1])
            else:
                data = _open_window(state, time, key, end, True)
            if data is not None:
                # Its timer stays, without the window: it may also forget
                # a retained one.
                time.set_timer(key, end - 1)
                pending.closed.append((record.index, key, start, end, data))
            _set_bare_timer(time, key, end - 1 + self.retain_ms)
        state.set(at, self.aggregate.encode(self.aggregate.add(self._decode(data), input)))
        pending.updated.append((record.index, record.topic, record.partition, key, end))
        return True

    def _add_to_session(self, record, key, time, input, watermark, pending) -> bool:
        state, agg, gap = record.state(), self.aggregate, self.windows.gap_ms
        start, end = time, time + gap
        sessions = _read_sessions(state, _SESSION_PREFIX + key)
        meets, apart = [], []
        for s in sessions:
            # A session the watermark has passed is closed, though its timer
            # fires only at the batch's end: nothing joins it.
            is_open = watermark is None or s[1] - 1 > watermark
            (meets if is_open and s[0] < time + gap and time < s[1] else apart).append(s)
        for s in meets:
            start, end = min(start, s[0]), max(end, s[1])
        if watermark is not None and end - 1 <= watermark:
            return self._update_closed_session(record, key, time, input, watermark, sessions, pending)
        acc = agg.add(agg.init(), input)
        for s in meets:
            # With a retention, the timer may also forget a closed session.
            if s[1] != end and self.retain_ms == 0:
                record.time().delete_timer(key, s[1] - 1)
            other = agg.decode(s[2])
            if other is not None:
                acc = agg.merge(acc, other)
        record.time().set_timer(key, end - 1)
        sessions = apart + [[start, end, agg.encode(acc)]]
        sessions.sort(key=lambda s: s[0])
        _write_sessions(state, _SESSION_PREFIX + key, sessions)
        if pending.early is not None:
            pending.early.append((record.index, record.topic, record.partition, key, end))
        return True

    def _update_closed_session(self, record, key, time, input, watermark, sessions, pending) -> bool:
        """Adds a late record to the retained closed session of its key whose
        records' span holds its time (closing it first if its timer has not
        yet: `sessions` are the key's open ones)."""
        gap = self.windows.gap_ms

        def holds(s):
            return self._retained(s[1], watermark) and s[0] <= time <= s[1] - gap

        state = record.state()
        retained = _read_sessions(state, _RETAINED_SESSION_PREFIX + key)
        at = next((i for i, s in enumerate(retained) if holds(s)), None)
        if at is None:
            found = next(
                (i for i, s in enumerate(sessions) if s[1] - 1 <= watermark and holds(s)), None
            )
            if found is None:
                return False
            session = sessions.pop(found)
            _write_sessions(state, _SESSION_PREFIX + key, sessions)
            pending.closed.append((record.index, key, session[0], session[1], session[2]))
            record.time().set_timer(key, session[1] - 1 + self.retain_ms)
            retained.append(session)
            retained.sort(key=lambda s: s[0])
            at = next(i for i, s in enumerate(retained) if holds(s))
        session = retained[at]
        session[2] = self.aggregate.encode(self.aggregate.add(self._decode(session[2]), input))
        _write_sessions(state, _RETAINED_SESSION_PREFIX + key, retained)
        pending.updated.append((record.index, record.topic, record.partition, key, session[1]))
        return True

    def _close(self, batch: Batch, timer: FiredTimer, out: Output, emit) -> None:
        """Hands out the window `timer` closes, as final, keeping it if there
        is a retention; forgets the retained window it ends."""
        state, end = timer.state(), timer.at_ms + 1
        if self.retain_ms > 0:
            self._find(state, timer.key, end - self.retain_ms, retained=True, take=True)
        if isinstance(self.windows, Session):
            closed = self._find(state, timer.key, end, retained=False, take=True)
        else:
            data = _window_in(state, timer.value, timer.key, end, True)
            closed = None if data is None else (end - self.windows.size_ms, data)
        if closed is None:
            return
        start, data = closed
        if self.retain_ms > 0:
            self._keep_closed(state, timer.key, start, end, data)
            if isinstance(self.windows, Session):
                timer.time().set_timer(timer.key, timer.at_ms + self.retain_ms)
            else:
                _set_bare_timer(timer.time(), timer.key, timer.at_ms + self.retain_ms)
        self._hand_out(batch, out, emit, timer.index, timer.key, start, end, data, "final")

    def _find(self, state: State, key: bytes, end: int, retained: bool, take: bool):
        """The window of `key` ending at `end`, open or `retained`: (start,
        bytes), removed from state when `take`; None if there is none."""
        if isinstance(self.windows, Session):
            at = (_RETAINED_SESSION_PREFIX if retained else _SESSION_PREFIX) + key
            sessions = _read_sessions(state, at)
            found = next((i for i, s in enumerate(sessions) if s[1] == end), None)
            if found is None:
                return None
            start, _, data = sessions.pop(found)
            if take:
                _write_sessions(state, at, sessions)
            return start, data
        if retained:
            at = _retained_key(end, key)
            data = state.get(at)
            if data is not None and take:
                state.delete(at)
        else:
            data = _open_window(state, Time(state._index), key, end, take)
        if data is None:
            return None
        return end - self.windows.size_ms, data

    def _keep_closed(self, state: State, key: bytes, start: int, end: int, data: bytes) -> None:
        """Keeps a closed window for late records."""
        if isinstance(self.windows, Session):
            retained = _read_sessions(state, _RETAINED_SESSION_PREFIX + key)
            retained.append([start, end, data])
            retained.sort(key=lambda s: s[0])
            _write_sessions(state, _RETAINED_SESSION_PREFIX + key, retained)
        else:
            state.set(_retained_key(end, key), data)

    def _hand_out(self, batch, out, emit, index, key, start, end, data, why) -> None:
        acc = self.aggregate.decode(data)
        if acc is None:
            return
        topic, partition = batch.partition_of(index) or ("", 0)
        emit(out, WindowValue(topic, partition, key, start, end, acc, why, State(index)))

    def _emit_changed(self, batch: Batch, touched, why: str, out: Output, emit) -> None:
        """Hands out, as `why`, each window the batch changed (early: still
        open; update: still retained), once, in the order first changed."""
        seen = set()
        for index, topic, partition, key, end in touched:
            if (topic, partition, key, end) in seen:
                continue
            seen.add((topic, partition, key, end))
            found = self._find(State(index), key, end, retained=why == "update", take=False)
            if found is not None:
                start, data = found
                self._hand_out(batch, out, emit, index, key, start, end, data, why)
