"""What deleting state keys one statement per key costs against `IN` lists
of up to 512 keys (what the SQLite and MySQL sinks send since stop 54,
crates/sql/src/multidelete.rs), in the database alone: a table keyed like
`keyed_state` (scope, then key), 5,000 sorted keys deleted per round in
one transaction, the two ways interleaved. Not a test: a measurement for
BENCHMARKS.md.

Usage: python3 bulk_deletes.py sqlite|mysql [ROUNDS]
MySQL: MariaDB on 127.0.0.1:3306, user root, database test, and
`pip install pymysql`; the table `sluice_bench_bulk_deletes` is dropped
after.
"""

import os
import sqlite3
import sys
import tempfile
import time

KEYS = 5_000
IN_LIST = 512
TABLE = "sluice_bench_bulk_deletes"


def connect(db):
    if db == "sqlite":
        path = os.path.join(tempfile.mkdtemp(), "bulk.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        blob, param, tail = "BLOB", "?", " WITHOUT ROWID"
    else:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", database="test")
        blob, param, tail = "VARBINARY(255)", "%s", " ENGINE=InnoDB"
    cur = conn.cursor()
    cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
    cur.execute(
        f"CREATE TABLE {TABLE} (scope BIGINT NOT NULL, state_key {blob} NOT NULL, "
        f"value {blob}, PRIMARY KEY (scope, state_key)){tail}"
    )
    return conn, cur, param


def begin(conn, cur, db):
    if db == "sqlite":
        cur.execute("BEGIN")


def main():
    db = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    conn, cur, p = connect(db)
    total = KEYS * 2 * rounds * 2
    rows = [(i % 4, b"\xfft" + i.to_bytes(8, "big") + b"k%d" % i, b"x") for i in range(total)]
    begin(conn, cur, db)
    cur.executemany(f"INSERT INTO {TABLE} VALUES ({p}, {p}, {p})", rows)
    conn.commit()
    keys = sorted(r[:2] for r in rows)

    def per_key(batch):
        for scope, key in batch:
            cur.execute(f"DELETE FROM {TABLE} WHERE scope = {p} AND state_key = {p}", (scope, key))

    def in_lists(batch):
        by_scope = {}
        for scope, key in batch:
            by_scope.setdefault(scope, []).append(key)
        for scope, scoped in by_scope.items():
            for at in range(0, len(scoped), IN_LIST):
                chunk = scoped[at : at + IN_LIST]
                marks = ", ".join([p] * len(chunk))
                cur.execute(
                    f"DELETE FROM {TABLE} WHERE scope = {p} AND state_key IN ({marks})",
                    [scope] + chunk,
                )

    for round_ in range(rounds):
        for name, delete in (("one statement per key", per_key), (f"IN lists of {IN_LIST}", in_lists)):
            batch, keys = keys[:KEYS], keys[KEYS:]
            begin(conn, cur, db)
            started = time.perf_counter()
            delete(batch)
            conn.commit()
            took = (time.perf_counter() - started) * 1000
            print(f"{db} round {round_ + 1}: {name}: {took:.1f} ms for {KEYS} keys")
    cur.execute(f"SELECT count(*) FROM {TABLE}")
    left = cur.fetchone()[0]
    assert left == len(keys), f"{left} rows left, expected {len(keys)}"
    cur.execute(f"DROP TABLE {TABLE}")
    conn.commit()


if __name__ == "__main__":
    main()
