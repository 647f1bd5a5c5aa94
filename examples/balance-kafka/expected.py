#!/usr/bin/env python3
"""Recomputes expected.txt from movements.jsonl, independently of sluice:
per account, the movements applied and the final balance (a withdrawal
past zero is rejected and changes nothing); then the records rejected."""
import json
import pathlib

here = pathlib.Path(__file__).parent
balance, applied, rejected = {}, {}, 0
for line in (here / "movements.jsonl").read_text().splitlines():
    try:
        m = json.loads(line)
        ok = (isinstance(m.get("account"), str) and m["account"]
              and isinstance(m.get("cents"), int) and not isinstance(m["cents"], bool))
    except ValueError:
        ok = False
    if not ok:
        rejected += 1
        continue
    after = balance.get(m["account"], 0) + m["cents"]
    if after < 0:
        rejected += 1
        continue
    balance[m["account"]] = after
    applied[m["account"]] = applied.get(m["account"], 0) + 1
for account in sorted(balance):
    print(f"{account} movements={applied[account]} balance={balance[account]}")
print(f"dead letters={rejected}")
