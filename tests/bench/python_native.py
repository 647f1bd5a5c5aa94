"""The Python SDK and a Python transform under native CPython, for
bench-languages: the same transform and the same records as the Wasm
module it builds, so "Python in Wasm vs native CPython" compares the
interpreters, not two programs. Not a test guest: it stands in for the
host with plain Python objects (the WIT types as named tuples, keyed state
as a dict, the log discarded) and must not be used as a runtime.

Usage: python3 python_native.py PROJECT_DIR SDK_DIR RECORDS.jsonl ROUNDS [--profile]

RECORDS.jsonl: one record per line, {"key": str|null, "value": str|null}
(UTF-8), all of one partition. Prints the best ns/record over ROUNDS runs
of one batch of them; with --profile, also where the time went: the
SDK's share (functions of sluice_plugin) against the transform's own.
"""

import importlib
import json
import sys
import time
import types
from collections import namedtuple


def stub_modules():
    """`wit_world` and `componentize_py_types` as the SDK imports them."""
    wit = types.ModuleType("wit_world.imports.types")
    for name, fields in {
        "Rejection": "index reason",
        "TargetRows": "target rows columns",
        "Output": "targets rejections",
        "Column": "name nulls data",
        "VarColumn": "lengths data",
        "BatchError": "message retryable",
        "ColumnData_Int64": "value",
        "ColumnData_Float64": "value",
        "ColumnData_Text": "value",
        "ColumnData_Bytes": "value",
        "ColumnData_Boolean": "value",
    }.items():
        setattr(wit, name, namedtuple(name, fields))

    log = types.ModuleType("wit_world.imports.log")

    class Level:
        DEBUG, INFO, WARN, ERROR = range(4)

    log.Level = Level
    log.write = lambda level, message: None

    state = types.ModuleType("wit_world.imports.state")
    state.store = {}
    state.get = lambda index, key: state.store.get(key)
    state.set = lambda index, key, value, expires: state.store.__setitem__(key, value)
    state.delete = lambda index, key: state.store.pop(key, None)

    imports = types.ModuleType("wit_world.imports")
    imports.types, imports.log, imports.state = wit, log, state
    world = types.ModuleType("wit_world")
    world.imports = imports
    world.WitWorld = object
    cpt = types.ModuleType("componentize_py_types")

    class Err(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

    cpt.Err = Err
    sys.modules.update(
        {
            "wit_world": world,
            "wit_world.imports": imports,
            "wit_world.imports.types": wit,
            "wit_world.imports.log": log,
            "wit_world.imports.state": state,
            "componentize_py_types": cpt,
        }
    )
    return state


Slice = namedtuple("Slice", "topic partition first count")
Raw = namedtuple(
    "Raw",
    "slices offsets timestamps key_lengths keys value_lengths values header_counts "
    "header_name_lengths header_names header_value_lengths header_values",
)
Ctx = namedtuple("Ctx", "pipeline batch_id batch_time_ms seed")


def raw_batch(path):
    """The records of `path` as the host lays out a batch."""
    keys, values, key_lengths, value_lengths = [], [], [], []
    for line in open(path, encoding="utf-8"):
        record = json.loads(line)
        for text, data, lengths in (
            (record["key"], keys, key_lengths),
            (record["value"], values, value_lengths),
        ):
            if text is None:
                lengths.append(-1)
            else:
                encoded = text.encode("utf-8")
                data.append(encoded)
                lengths.append(len(encoded))
    n = len(key_lengths)
    return Raw(
        [Slice("bench", 0, 0, n)],
        list(range(n)),
        [1_700_000_000_000] * n,
        key_lengths,
        b"".join(keys),
        value_lengths,
        b"".join(values),
        [0] * n,
        [],
        b"",
        [],
        b"",
    )


def main():
    project, sdk, records, rounds = sys.argv[1:5]
    profile = "--profile" in sys.argv[5:]
    state = stub_modules()
    sys.path[:0] = [project, sdk]
    app = importlib.import_module("app")
    world = app.WitWorld()
    world.init("")
    raw = raw_batch(records)
    ctx = Ctx("bench", "bench", 1_700_000_000_000, 1)
    n = len(raw.offsets)
    best = float("inf")
    for _ in range(int(rounds)):
        state.store = {}
        started = time.perf_counter()
        world.process(ctx, raw)
        best = min(best, (time.perf_counter() - started) * 1e9 / n)
    print(f"ns_per_record {best:.0f}")
    if profile:
        split(world, ctx, raw, state)


def split(world, ctx, raw, state):
    """Time in the SDK's functions (their own time, not what they call
    back into) against the rest, under cProfile."""
    import cProfile
    import pstats

    state.store = {}
    profiler = cProfile.Profile()
    profiler.runcall(world.process, ctx, raw)
    stats = pstats.Stats(profiler).stats
    sdk = sum(s[2] for (file, _, _), s in stats.items() if "sluice_plugin" in file)
    total = sum(s[2] for s in stats.values())
    print(f"sdk_share {sdk / total:.3f}")
    for (file, line, name), s in sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]:
        where = "sdk" if "sluice_plugin" in file else "   "
        print(f"  {where} {s[2] * 1e3:8.1f} ms  {s[0]:7d} calls  {name} ({file.split('/')[-1]}:{line})")


if __name__ == "__main__":
    main()
