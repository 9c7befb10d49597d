#!/usr/bin/env bash
# Builds a service crate that lives outside this repository's workspace and depends on
# eventfold by path, as a team's own service would: no `[patch]` section, no workspace
# lints. Fails if the build prints any warning (ours or a dependency's), then runs the
# service on the embedded log and checks that it serves a command, a read and a view query.
#
# The crate is examples/quickstart's sources under the name `outside`, with a manifest of
# its own. It builds in CARGO_TARGET_DIR with the workspace's Cargo.lock as a seed, so the
# dependencies compiled for the workspace are reused.
#
# Usage: scripts/check_outside_crate.sh [--keep]   (--keep: leave the crate's directory)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  if [ "${1:-}" != --keep ]; then rm -rf "$dir"; else echo "kept $dir" >&2; fi
}
trap 'cleanup "${keep:-}"' EXIT
keep=${1:-}

mkdir -p "$dir/outside/src"
cp examples/quickstart/src/*.rs "$dir/outside/src/"
sed -i 's/\bquickstart::/outside::/g' "$dir/outside/src/"*.rs
cp Cargo.lock "$dir/outside/Cargo.lock"
cat >"$dir/outside/Cargo.toml" <<EOF
[package]
name = "outside"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
eventfold = { path = "$root/crates/eventfold" }
anyhow = "1"
serde = { version = "1", features = ["derive"] }
serde_json = "1"

# As the workspace builds its dependencies (so CI reuses them from CARGO_TARGET_DIR).
[profile.dev.package."*"]
opt-level = 2

[workspace]
EOF

echo "building $dir/outside (eventfold by path, no [patch])" >&2
log="$dir/build.log"
if ! (cd "$dir/outside" && cargo build --color never 2>&1) | tee "$log" >&2; then
  echo "check_outside_crate: the crate outside the workspace does not build" >&2
  exit 1
fi
if grep -E '^warning' "$log" >&2; then
  echo "check_outside_crate: building a crate that depends on eventfold printed warnings (above)" >&2
  exit 1
fi
bin="${CARGO_TARGET_DIR:-$dir/outside/target}/debug/outside"

# Serve on a free port on the embedded log and talk to it.
EVENTFOLD_LOG=warn "$bin" --http 127.0.0.1:0 --data-dir "$dir/data" 2>"$dir/serve.log" &
pid=$!
url=
for _ in $(seq 1 300); do
  url=$(sed -n 's/^outside: serving \([^ ]*\).*/\1/p' "$dir/serve.log" | head -n 1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log" >&2; echo "check_outside_crate: the service exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$dir/serve.log" >&2; echo "check_outside_crate: no 'serving' line in 30 s" >&2; exit 1; }

# Asserts `curl ARGS...` answers STATUS with a body containing TEXT.
expect() {
  local status=$1 text=$2 out code
  shift 2
  out=$(curl -sS -w '\n%{http_code}' "$@")
  code=${out##*$'\n'}
  out=${out%$'\n'*}
  if [ "$code" != "$status" ] || [[ "$out" != *"$text"* ]]; then
    echo "check_outside_crate: curl $* answered $code $out; expected $status with $text" >&2
    exit 1
  fi
  echo "$out"
}
for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 200 ] && break
  sleep 0.1
done
expect 200 '"position"' -X POST "$url/v1/aggregates/account/a-1/commands" -d '{"type":"Open","owner":"ann"}' >/dev/null
out=$(expect 200 '"position"' -X POST "$url/v1/aggregates/account/a-1/commands" -d '{"type":"Deposit","amount_cents":500}')
position=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["position"])' <<<"$out")
expect 422 '"error"' -X POST "$url/v1/aggregates/account/a-1/commands" -d '{"type":"Withdraw","amount_cents":800}' >/dev/null
expect 200 '"version":2' "$url/v1/aggregates/account/a-1" >/dev/null
expect 200 '"balance_cents":500' "$url/v1/views/accounts/a-1?min_position=$position" >/dev/null
expect 200 '"a-1"' "$url/v1/views/accounts?owner=ann" >/dev/null
echo "check_outside_crate: a crate outside the workspace built without warnings and served at $url" >&2
