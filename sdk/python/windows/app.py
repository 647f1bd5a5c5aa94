"""The windowed conformance transform in Python: the same as the Rust test
plugin `tests/plugins/windows` (per record key, the sum and count of the
records' `amount` in windows of event time, one `windows` row per window),
so the two must give the same rows, state and digest on the same input
(tests/tests/languages.rs).

Records: a key, and a JSON value `{"amount": N}` (optionally the event time
under `time_field`; else the Kafka timestamp). Anything else is rejected.
Params: `windows` ("tumbling" with `size_ms`, "hopping" with `size_ms` and
`hop_ms`, "session" with `gap_ms`), `early`, `retain_ms`, `time_field`."""

import struct

from sluice_plugin import Transform, export
from sluice_plugin.window import (
    Aggregate, Event, Hopping, Rejected, Session, Tumbling, Windowed,
)

_I64 = (-(1 << 63), (1 << 63) - 1)


def _int64(value):
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if _I64[0] <= value <= _I64[1] else None


class SumCount(Aggregate):
    """(total, records), 16 bytes: two big-endian int64."""

    def init(self):
        return (0, 0)

    def add(self, acc, amount):
        return (acc[0] + amount, acc[1] + 1)

    def merge(self, acc, other):
        return (acc[0] + other[0], acc[1] + other[1])

    def encode(self, acc):
        return struct.pack(">qq", *acc)

    def decode(self, data):
        return struct.unpack(">qq", data[:16]) if len(data) >= 16 else None


class WindowSums(Transform):
    def __init__(self, params):
        def ms(name):
            value = _int64(params.get(name))
            if value is None or value <= 0:
                raise ValueError(f"windows params: `{name}` must be a positive integer")
            return value

        kind = params.get("windows")
        if kind == "tumbling":
            windows = Tumbling(ms("size_ms"))
        elif kind == "hopping":
            windows = Hopping(ms("size_ms"), ms("hop_ms"))
        elif kind == "session":
            windows = Session(ms("gap_ms"))
        else:
            raise ValueError("windows params: `windows` is tumbling, hopping or session")
        retain_ms = _int64(params.get("retain_ms")) or 0
        self.windowed = Windowed(
            windows, SumCount(), early=params.get("early") is True, retain_ms=retain_ms
        )
        self.time_field = params.get("time_field")

    def take(self, r):
        try:
            obj = r.json()
        except ValueError:
            obj = None
        amount = _int64(obj.get("amount")) if isinstance(obj, dict) else None
        if amount is None:
            return Rejected("the value is not JSON with an integer `amount`")
        time_ms = _int64(obj.get(self.time_field)) if isinstance(self.time_field, str) else None
        return Event(key=r.key or b"", time_ms=time_ms, input=amount)

    def process(self, batch, out):
        t = out.target(
            "windows", partition="int64", key="text", start_ms="int64",
            end_ms="int64", total="int64", records="int64", emit="text",
        )

        def emit(out, w):
            out.row(
                t, w.partition, w.key.decode("utf-8", "replace"), w.start_ms,
                w.end_ms, w.acc[0], w.acc[1], w.emit,
            )

        self.windowed.run(batch, out, self.take, emit)


WitWorld = export(WindowSums)
