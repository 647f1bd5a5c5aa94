#!/usr/bin/env python3
"""Recomputes expected.txt from events.jsonl, independently of sluice: per
user, the first sightings of event ids (count, amount) and the repeats
dropped; then the records that are not events (dead letters)."""
import json
import pathlib

here = pathlib.Path(__file__).parent
seen, events, amounts, repeats, dead = set(), {}, {}, {}, 0
for line in (here / "events.jsonl").read_text().splitlines():
    try:
        e = json.loads(line)
        ok = (isinstance(e.get("id"), str) and e["id"] and isinstance(e.get("user"), str)
              and e["user"] and isinstance(e.get("amount"), (int, float))
              and not isinstance(e.get("amount"), bool))
    except ValueError:
        ok = False
    if not ok:
        dead += 1
        continue
    user = e["user"]
    if e["id"] in seen:
        repeats[user] = repeats.get(user, 0) + 1
        continue
    seen.add(e["id"])
    events[user] = events.get(user, 0) + 1
    amounts[user] = amounts.get(user, 0) + e["amount"]
for user in sorted(events):
    print(f"{user} events={events[user]} amount={amounts[user]:.2f} repeats={repeats.get(user, 0)}")
print(f"dead letters={dead}")
