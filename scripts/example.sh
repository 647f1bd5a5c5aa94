#!/usr/bin/env bash
# Runs one example of examples/ from scratch: starts a local Tansu broker,
# creates the example's topic, produces its sample data, drops the example's
# schema (SQL examples) or keys (Redis: those under the example's `dedupe:`
# prefix), runs the pipeline until caught up and prints where the result
# is. Usage: scripts/example.sh NAME (see examples/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
name="${1:?usage: scripts/example.sh word-count|json-filter|orders-mysql|word-count-postgres|changelog-upsert|dedupe-redis|dedupe-postgres|spend-per-minute-postgres|inspect-stdout|enrich-kafka|balance-kafka|sessions-kafka}"
case "$name" in
  word-count)          topic=words;            partitions=4; data=examples/word-count/words.txt ;;
  word-count-postgres) topic=words;            partitions=4; data=examples/word-count/words.txt ;;
  json-filter)         topic=events;           partitions=2; data=examples/json-filter/events.jsonl ;;
  orders-mysql)        topic=orders;           partitions=2; data=examples/orders-mysql/orders.jsonl ;;
  changelog-upsert)    topic=customer-changes; partitions=1; data=examples/changelog-upsert/changes.jsonl ;;
  dedupe-redis)        topic=user-events;      partitions=2; data=examples/dedupe-redis/events.jsonl ;;
  dedupe-postgres)     topic=payments;         partitions=1; data=examples/dedupe-postgres/events.jsonl ;;
  spend-per-minute-postgres) topic=payments-by-minute; partitions=1; data=examples/spend-per-minute-postgres/payments.jsonl ;;
  inspect-stdout)      topic=events;           partitions=2; data=examples/json-filter/events.jsonl ;;
  enrich-kafka)        topic=order-events;     partitions=2; data=examples/enrich-kafka/orders.jsonl
                       sink_topics="orders-enriched:2 enrich.dead-letters:1 enrich.lineage:1" ;;
  balance-kafka)       topic=movements;        partitions=1; data=examples/balance-kafka/movements.jsonl
                       sink_topics="balances:1 balance.dead-letters:1 balance.lineage:1 balance.state:1" ;;
  sessions-kafka)      topic=page-views;       partitions=1; data=examples/sessions-kafka/views.jsonl
                       sink_topics="sessions:1 sessions.dead-letters:1 sessions.lineage:1 sessions.state:1" ;;
  *) echo "unknown example $name" >&2; exit 2 ;;
esac
config="examples/$name/pipeline.toml"
schema="$(sed -n 's/^schema = "\(.*\)"/\1/p' "$config")"
case "$(sed -n 's/^url = "\([a-z]*\):.*/\1/p' "$config")" in
  postgres) psql -q -h 127.0.0.1 -U postgres test -c "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" ;;
  mysql)    mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS \`$schema\`" ;;
  sqlite)   rm -f "examples/$name/"*.db* ;;
  stdout|kafka) rm -f "examples/$name/.sluice-state.db"* ;;
  redis)    redis-cli --scan --pattern 'dedupe:*' | xargs -r redis-cli del >/dev/null ;;
esac
port=19092
scripts/build-plugins.sh >/dev/null
cargo build --quiet --release -p sluice --bin sluice -p sluice-tests --bin kafka-tool
target="${CARGO_TARGET_DIR:-$root/target}/release"
scripts/tansu.sh stop "$port" >/dev/null 2>&1 || true
scripts/tansu.sh start "$port"
trap 'scripts/tansu.sh stop "$port"' EXIT
"$target/kafka-tool" create-topic "127.0.0.1:$port" "$topic" "$partitions"
"$target/kafka-tool" produce "127.0.0.1:$port" "$topic" "$data"
for t in ${sink_topics:-}; do
  "$target/kafka-tool" create-topic "127.0.0.1:$port" "${t%:*}" "${t#*:}"
done
"$target/sluice" run --until-caught-up "$config"
for t in ${sink_topics:-}; do
  case "$t" in *.lineage:*|*.state:*) continue ;; esac
  echo "── ${t%:*}"; "$target/kafka-tool" consume "127.0.0.1:$port" "${t%:*}"
done
echo "done: see $config for the tables (schema ${schema:-none}); expected: examples/$name/expected.txt"
