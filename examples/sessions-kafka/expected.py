#!/usr/bin/env python3
"""Recomputes expected.txt from views.jsonl, independently of sluice: the
sessions of page views per user (a session ends 30 minutes after its last
view), as the pipeline writes them to the `sessions` topic. The watermark
before a view is the highest `ts` before it minus the allowed lateness
(60 s); a session [start, end) is closed once the watermark reaches
end - 1, and only closed sessions are written. A view joins the open
sessions of its user it falls within 30 minutes of (merging them); a view
whose session would be closed already is late (a dead letter). A line that
is not a view is rejected and moves no watermark."""
import json
import pathlib

LATENESS, GAP = 60_000, 30 * 60_000
here = pathlib.Path(__file__).parent
watermark, sessions, late, rejected = None, {}, 0, 0


def is_open(s):
    return watermark is None or s[1] - 1 > watermark


for line in (here / "views.jsonl").read_text().splitlines():
    try:
        v = json.loads(line)
        ok = (isinstance(v, dict) and isinstance(v.get("user"), str) and v["user"]
              and isinstance(v.get("ts"), int) and not isinstance(v["ts"], bool))
    except ValueError:
        ok = False
    if not ok:
        rejected += 1
        continue
    ts, kept = v["ts"], sessions.setdefault(v["user"], [])
    meets = [s for s in kept if is_open(s) and s[0] < ts + GAP and ts < s[1]]
    start = min([ts] + [s[0] for s in meets])
    end = max([ts + GAP] + [s[1] for s in meets])
    if watermark is not None and end - 1 <= watermark:
        late += 1
    else:
        kept[:] = [s for s in kept if s not in meets]
        kept.append((start, end, 1 + sum(s[2] for s in meets)))
    watermark = max(watermark if watermark is not None else ts - LATENESS, ts - LATENESS)
print("user start_ms end_ms views")
still_open = 0
for user in sorted(sessions):
    for start, end, views in sorted(sessions[user]):
        if end - 1 <= watermark:
            print(f"{user} {start} {end} {views}")
        else:
            still_open += 1
print(f"open={still_open} late={late} rejected={rejected}")
