#!/usr/bin/env bash
# The quickstart on a fresh machine: starts a local Tansu broker, creates the
# `words` topic, produces examples/word-count/words.txt, runs the word-count
# plugin exactly-once into SQLite until caught up, and prints the result.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
port=19092
scripts/build-plugins.sh >/dev/null
cargo build --quiet --release -p sluice --bin sluice -p sluice-tests --bin kafka-tool
target="${CARGO_TARGET_DIR:-$root/target}/release"
scripts/tansu.sh stop "$port" >/dev/null 2>&1 || true
scripts/tansu.sh start "$port"
trap 'scripts/tansu.sh stop "$port"' EXIT
rm -f examples/word-count/word-count.db*
"$target/kafka-tool" create-topic "127.0.0.1:$port" words 4
"$target/kafka-tool" produce "127.0.0.1:$port" words examples/word-count/words.txt
"$target/sluice" run --until-caught-up examples/word-count/pipeline.toml
echo "word counts (examples/word-count/word-count.db, table word_counts):"
python3 - <<'PY'
import sqlite3
db = sqlite3.connect("examples/word-count/word-count.db")
for word, n in db.execute("SELECT word, n FROM word_counts ORDER BY n DESC, word LIMIT 10"):
    print(f"  {word:10} {n}")
print("batches committed:", db.execute("SELECT count(*) FROM sluice_batches").fetchone()[0])
PY
echo "the sluice binary is $target/sluice; to have it on PATH: cargo install --path host (into ~/.cargo/bin)"
