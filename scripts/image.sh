#!/usr/bin/env bash
# The container image, built from nothing (deploy/container/Containerfile):
#
#   scripts/image.sh              build a static sluice (musl) and the image
#                                 localhost/sluice:latest with podman
#   scripts/image.sh quickstart   build it, then run the quickstart inside it:
#                                 a local broker on the host, the container on
#                                 the host's network, word count into a SQLite
#                                 file on a mounted directory, checked against
#                                 examples/word-count/expected.txt
#
# Installs what it needs when missing: rustup's x86_64-unknown-linux-musl
# target, Debian's musl-tools, podman and runc. podman runs with runc and no
# default ulimits (a containers.conf of this script's own, through
# CONTAINERS_CONF): crun refuses setrlimit and hybrid cgroups in sandboxes
# like the one this was built in. No registry is needed: nothing is pulled.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
musl=x86_64-unknown-linux-musl
image=localhost/sluice:latest

rustup target list --installed | grep -q "^$musl\$" || rustup target add "$musl"
missing=()
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$work/containers.conf"

# The binary: static, OpenSSL (the Kafka client's) compiled in.
scripts/build-plugins.sh >/dev/null
CC_x86_64_unknown_linux_musl=musl-gcc cargo build --quiet --release --target "$musl" \
  -p sluice --bin sluice --features static-openssl
bin="${CARGO_TARGET_DIR:-$root/target}/$musl/release/sluice"
if ldd "$bin" 2>&1 | grep -q '=>'; then
  echo "$bin is not static: $(ldd "$bin" 2>&1 | head -3)" >&2
  exit 1
fi

context="$work/context"
mkdir -p "$context/modules"
# Line tables stay in the build (readable panics); the image needs none.
strip -o "$context/sluice" "$bin"
cp /etc/ssl/certs/ca-certificates.crt "$context/"
cp plugins/dist/*.wasm "$context/modules/"
podman build --quiet -f deploy/container/Containerfile -t "$image" "$context" >/dev/null
echo "built $image ($(podman image inspect "$image" --format '{{.Size}}') bytes)"

[ "${1:-}" = quickstart ] || exit 0

# The quickstart inside the container: the broker and the input on the host.
port=19093
cargo build --quiet --release -p sluice-tests --bin kafka-tool
tool="${CARGO_TARGET_DIR:-$root/target}/release/kafka-tool"
scripts/tansu.sh stop "$port" >/dev/null 2>&1 || true
scripts/tansu.sh start "$port" >/dev/null
trap 'scripts/tansu.sh stop "$port" >/dev/null; rm -rf "$work"' EXIT
"$tool" create-topic "127.0.0.1:$port" words 4
"$tool" produce "127.0.0.1:$port" words examples/word-count/words.txt
run="$work/run"
mkdir -p "$run"
chmod 0777 "$run"
sed -e "s|^brokers = .*|brokers = \"127.0.0.1:$port\"|" \
  -e 's|^path = .*|path = "/opt/sluice/modules/word-count.wasm"|' \
  examples/word-count/pipeline.toml >"$run/pipeline.toml"
podman run --rm --network host -v "$run:/work" "$image" \
  run --until-caught-up /work/pipeline.toml
python3 - "$run/word-count.db" examples/word-count/expected.txt <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
got = {w: n for w, n in db.execute("SELECT word, n FROM word_counts")}
want = {}
for line in open(sys.argv[2]):
    if line.strip():
        word, n = line.split()
        want[word] = int(n)
assert got == want, f"the container's word counts differ from expected.txt: {sorted(set(got.items()) ^ set(want.items()))[:10]}"
print(f"quickstart in the container: {len(got)} words, as expected.txt says")
PY
