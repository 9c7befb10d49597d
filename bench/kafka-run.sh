#!/usr/bin/env bash
# One Kafka-mode measurement on a fresh shop: the quick A/B tool behind the
# "alternated pairs" of bench/FINDINGS.md (bench/run.py is the whole suite).
#
#   bench/kafka-run.sh OUT MODE [VAR=VALUE ...]
#
# MODE: topic (commands topic at most: load-topic --in-flight 4096), topic-rate (RATE
# commands/s through the topic), http-rate (RATE commands/s over HTTP, 1,024 connections),
# http-clients (CLIENTS closed-loop HTTP clients, default 64). VAR=VALUE pairs go to the
# shop's environment (e.g. EVENTFOLD_KAFKA_MIN_TRANSACTION_INTERVAL_MS=0); SHOP_ARGS adds
# arguments to its command line, split at spaces (e.g. SHOP_ARGS="--kafka-config debug=eos").
#
# A new app (fresh topics) each run, PARTITIONS partitions (default 8), PREFILL seconds
# through the topic at most first (default 0; the bench's HTTP runs come after about 60 s
# of it), WARMUP seconds of unmeasured load (default 10), then DURATION measured (default 20;
# http-rate: after OPEN seconds, default 1, sent unmeasured by the same load process, which
# opens its connections meanwhile). Prints one line: rate,
# latency percentiles and the CPU time per command of the shop and of the broker (from
# /proc/<pid>/stat over the measured run); OUT.json, OUT.metrics.before, OUT.metrics (the
# shop's /metrics before and after the measured run), OUT.threads.before and
# OUT.threads.after (every thread of both processes: CPU ticks and context switches) and
# OUT.shop.log keep the details; THREADS=1 also prints, per process, the busiest thread
# names with their CPU per command and context switches per second. TIMELINE=1 also writes
# OUT.timeline over the measured run (bench/timeline.py: per half second, commands over
# 50 ms, transaction stages, busiest threads) and prints a summary of its slow windows and
# what ran in them (the store's flushes and compactions, the broker's GC and JIT).
# DATA_ROOT: where the shop's data directory is made (default /tmp; e.g. /dev/shm to take
# the disk out). The app's topics are dropped afterwards; the broker deletes their files
# 60 s later (file.delete.delay.ms), which lands in the next run if it starts at once.
#
# Needs a running broker (scripts/kafka/broker.sh start) and release binaries:
#   cargo build --release --locked -p shop -p eventfold-tools --bins
# SHOP, EF: the binaries (default $CARGO_TARGET_DIR/release/{shop,eventfold}, else
# target/release); BOOT: bootstrap servers (default 127.0.0.1:9092); BROKER_DIR: the
# broker script's state directory, for its pid (default /tmp/eventfold-kafka, as
# EVENTFOLD_KAFKA_DIR).
set -euo pipefail
if [ $# -lt 2 ]; then
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"
  exit 2
fi
OUT=$1; MODE=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$here/target}/release
SHOP=${SHOP:-$bin/shop}; EF=${EF:-$bin/eventfold}
BOOT=${BOOT:-127.0.0.1:9092}
BROKER_DIR=${BROKER_DIR:-${EVENTFOLD_KAFKA_DIR:-/tmp/eventfold-kafka}}
PARTITIONS=${PARTITIONS:-8}; PREFILL=${PREFILL:-0}; WARMUP=${WARMUP:-10}; DURATION=${DURATION:-20}
RATE=${RATE:-5000}; CLIENTS=${CLIENTS:-64}
for b in "$SHOP" "$EF"; do
  [ -x "$b" ] || { echo "kafka-run: $b is missing: cargo build --release --locked -p shop -p eventfold-tools --bins" >&2; exit 1; }
done
bpid=$(cat "$BROKER_DIR/broker.pid" 2>/dev/null) && kill -0 "$bpid" 2>/dev/null \
  || { echo "kafka-run: no broker running under $BROKER_DIR (scripts/kafka/broker.sh start)" >&2; exit 1; }

app=kr$(date +%s%N | tail -c 9)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d "${DATA_ROOT:-/tmp}/kafka-run.XXXXXX")
env "$@" EVENTFOLD_LOG="${EVENTFOLD_LOG:-warn}" "$SHOP" --http "127.0.0.1:$port" --data-dir "$dir" \
  --partitions "$PARTITIONS" --kafka "$BOOT" --app-id "$app" ${SHOP_ARGS:-} > "$OUT.shop.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
  "$EF" drop-app --bootstrap "$BOOT" --app "$app" --yes --json > /dev/null 2>&1 || true
}
trap cleanup EXIT
ready=
for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$port/readyz" > /dev/null && { ready=1; break; }
  kill -0 "$pid" 2>/dev/null || { echo "kafka-run: the shop stopped; see $OUT.shop.log" >&2; exit 1; }
  sleep 0.5
done
[ -n "$ready" ] || { echo "kafka-run: the shop was not ready within 120 s; see $OUT.shop.log" >&2; exit 1; }

topic_max() { # seconds
  "$EF" load-topic --bootstrap "$BOOT" --app "$app" --duration "${1}s" --in-flight 4096 --json --quiet
}
load() { # seconds
  case $MODE in
    topic) topic_max "$1" ;;
    topic-rate) "$EF" load-topic --bootstrap "$BOOT" --app "$app" --duration "${1}s" --rate "$RATE" --json --quiet ;;
    http-rate) "$EF" load --url "http://127.0.0.1:$port" --duration "${1}s" --rate "$RATE" --concurrency 1024 \
      --warmup "${2:-0}s" --json --quiet ;;
    http-clients) "$EF" load --url "http://127.0.0.1:$port" --duration "${1}s" --concurrency "$CLIENTS" --json --quiet ;;
    *) echo "kafka-run: unknown mode $MODE (topic, topic-rate, http-rate, http-clients)" >&2; exit 2 ;;
  esac
}
ticks() { awk '{print $14 + $15}' "$1/stat"; } # CPU ticks of /proc/<pid> or /proc/<pid>/task/<tid>
threads() { # label pid: a line per thread: label, name (spaces as _), CPU ticks, switches
  local t
  for t in /proc/"$2"/task/*; do
    echo "$1 $(tr ' ' '_' < "$t/comm" 2>/dev/null || echo gone) $(ticks "$t" 2>/dev/null || echo 0)" \
      "$(awk '/ctxt_switches/ {n += $2} END {print n + 0}' "$t/status" 2>/dev/null || echo 0)"
  done
}

if [ "$PREFILL" -gt 0 ]; then
  topic_max "$PREFILL" > "$OUT.prefill.json"
fi
load "$WARMUP" > /dev/null
# An open-loop run opens its 1,024 connections in its first 1,024/RATE seconds; the
# measured http-rate run first sends for OPEN seconds unmeasured (in the same process), so
# that it measures commands on open connections. Everything below starts after it.
open=0
if [ "$MODE" = http-rate ]; then open=${OPEN:-1}; fi
load "$DURATION" "$open" > "$OUT.json" &
loader=$!
sleep "$open"
curl -s "http://127.0.0.1:$port/metrics" > "$OUT.metrics.before"
s0=$(ticks "/proc/$pid"); b0=$(ticks "/proc/$bpid")
{ threads shop "$pid"; threads broker "$bpid"; } > "$OUT.threads.before"
tl=
if [ "${TIMELINE:-0}" = 1 ]; then
  python3 "$here/bench/timeline.py" "http://127.0.0.1:$port" "$pid" "$bpid" "$OUT.timeline" &
  tl=$!
fi
t0=$(date +%s.%N)
wait "$loader"
t1=$(date +%s.%N)
if [ -n "$tl" ]; then
  kill "$tl" && wait "$tl" || true
fi
s1=$(ticks "/proc/$pid"); b1=$(ticks "/proc/$bpid")
{ threads shop "$pid"; threads broker "$bpid"; } > "$OUT.threads.after"
curl -s "http://127.0.0.1:$port/metrics" > "$OUT.metrics"
python3 - "$OUT" "$((s1 - s0))" "$((b1 - b0))" "$(getconf CLK_TCK)" "${THREADS:-0}" "$t0" "$t1" "${TIMELINE:-0}" \
  "$here/bench" <<'PY'
import collections, json, re, sys
out, shop, broker, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
show_threads, seconds = sys.argv[5] == "1", float(sys.argv[7]) - float(sys.argv[6])
show_timeline = sys.argv[8] == "1"
r = json.load(open(out + ".json"))
n = max(r.get("requests") or 1, 1)
lat = r["latency_ms"]
us = 1e6 / hz / n
print(f"{out} rate {r['throughput_per_s']:.0f} p50 {lat['p50']:.1f} p90 {lat['p90']:.1f} "
      f"p99 {lat['p99']:.1f} max {lat['max']:.1f} shop_us/cmd {shop * us:.1f} broker_us/cmd {broker * us:.1f}")
if r.get("connect_ms"):
    # HTTP: the connections the load opened (warm-up included) and the longest opening.
    print(f"  connections opened {r['connects']}, the longest in {r['connect_ms']['max']:.1f} ms")


def threads(path):
    """(process, thread name with its numbers as #) -> [CPU ticks, context switches]."""
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(path):
        proc, name, cpu, switches = line.split()
        key = (proc, re.sub(r"\d+", "#", name))
        d[key][0] += int(cpu)
        d[key][1] += int(switches)
    return d


if show_threads:
    a, b = threads(out + ".threads.before"), threads(out + ".threads.after")
    # Threads that ended during the run are left out: their time is in neither snapshot.
    diff = {k: (b[k][0] - a[k][0], b[k][1] - a[k][1]) for k in b if k in a}
    for proc in ("shop", "broker"):
        rows = sorted(((v, k[1]) for k, v in diff.items() if k[0] == proc), reverse=True)
        switches = sum(v[1] for v, _ in rows) / seconds
        print(f"  {proc}: {switches:,.0f} context switches/s; busiest threads, µs of CPU per command "
              f"(switches/s): " + ", ".join(f"{name} {cpu * us:.1f} ({sw / seconds:,.0f})"
                                             for (cpu, sw), name in rows[:8] if cpu > 0))
if show_timeline:
    sys.path.insert(0, sys.argv[9])
    from timeline import summary
    t = summary(out + ".timeline")
    print(f"  timeline: {t['slow_windows']} of {t['windows']} windows had commands over 50 ms ({out}.timeline)"
          + "".join(f"\n    {w['t_s']} s: {w['slow']} of {w['commands']}, shop {w['shop_top']}, "
                    f"broker {w['broker_top']}, other {w['other_ticks']}, steal {w['steal']}"
                    for w in t["worst"]))
    print(f"    {t['windows_100_slow']} windows with 100+ over 50 ms; in them or the window before: "
          + ", ".join(f"{label} {n}" for label, n in t["in_or_before_100_slow"].items()))
PY
