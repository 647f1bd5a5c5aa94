#!/usr/bin/env bash
# Installs the guest-language toolchains `sluice build` calls, pinned, into
# ${SLUICE_TOOLCHAINS:-~/.cache/sluice/toolchains} (where `sluice build`
# looks when they are not on PATH): componentize-py (PyPI) in a venv, and
# componentize-js (npm). Node.js must be installed (Debian: nodejs npm).
set -euo pipefail
dir="${SLUICE_TOOLCHAINS:-$HOME/.cache/sluice/toolchains}"
mkdir -p "$dir"
if [ ! -x "$dir/python/bin/componentize-py" ]; then
  python3 -m venv "$dir/python"
  "$dir/python/bin/pip" install --quiet "componentize-py==0.25.1"
fi
command -v node >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
if [ ! -f "$dir/js/node_modules/@bytecodealliance/componentize-js/src/componentize.js" ]; then
  npm install --silent --no-audit --no-fund --prefix "$dir/js" "@bytecodealliance/componentize-js@0.23.0"
fi
echo "$dir"
