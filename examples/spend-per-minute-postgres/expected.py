#!/usr/bin/env python3
"""Recomputes expected.txt from payments.jsonl, independently of sluice:
per user and minute of event time (`ts`), the cents and the payments, as
the pipeline leaves them. The watermark before a payment is the highest
`ts` before it minus the allowed lateness (10 s); a minute [m, m + 60 s)
is final once the watermark reaches its last millisecond. A payment for a
final minute still counts while the watermark is less than 90 s past the
minute's last millisecond (the module retains closed minutes that long);
later, it is late (a dead letter). Open minutes show their running figure
(final = false). A line that is not a payment is rejected and moves no
watermark."""
import json
import pathlib

LATENESS, MINUTE, RETAIN = 10_000, 60_000, 90_000
here = pathlib.Path(__file__).parent
watermark, windows, late, rejected = None, {}, 0, 0
for line in (here / "payments.jsonl").read_text().splitlines():
    try:
        p = json.loads(line)
        ok = (isinstance(p, dict) and isinstance(p.get("user"), str) and p["user"]
              and isinstance(p.get("cents"), int) and isinstance(p.get("ts"), int))
    except ValueError:
        ok = False
    if not ok:
        rejected += 1
        continue
    start = p["ts"] - p["ts"] % MINUTE
    if watermark is not None and start + MINUTE - 1 + RETAIN <= watermark:
        late += 1
    else:
        cents, n = windows.get((p["user"], start), (0, 0))
        windows[(p["user"], start)] = (cents + p["cents"], n + 1)
    watermark = max(watermark or p["ts"] - LATENESS, p["ts"] - LATENESS)
print("user minute cents payments final")
for (user, start), (cents, n) in sorted(windows.items()):
    final = watermark >= start + MINUTE - 1
    print(f"{user} {start} {cents} {n} {str(final).lower()}")
print(f"late={late} rejected={rejected}")
