#!/usr/bin/env bash
# Builds every Rust guest of the repository (the workspace in plugins/: the
# SDK's conformance guest in sdk/rust, the examples' guests in
# examples/*/plugin, the tests' guests in tests/plugins) for
# wasm32-unknown-unknown (no WASI imports) and wraps each into a component:
# plugins/dist/<name>.wasm.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/plugins"
rustup target list --installed | grep -q '^wasm32-unknown-unknown$' \
  || rustup target add wasm32-unknown-unknown
command -v wasm-tools >/dev/null || cargo install wasm-tools --version 1.243.0 --locked \
  --no-default-features --features component
cargo build --quiet --release --target wasm32-unknown-unknown
out="${CARGO_TARGET_DIR:-$root/plugins/target}/wasm32-unknown-unknown/release"
mkdir -p dist
for core in "$out"/*.wasm; do
  name="$(basename "$core" .wasm | tr _ -)"
  wasm-tools component new "$core" -o "dist/$name.wasm"
done
ls dist
