#!/usr/bin/env bash
# Smoke test of the cqrs-es peer against a real PostgreSQL: starts the server (pg.sh) and
# the peer, drives one order through its lifecycle with curl, checks every status code,
# and stops both. Exits non-zero on the first failure.
#
# Environment: EF_PEER_LISTEN (default 127.0.0.1:18090), EF_PEER_BIN (a built cqrs-peer;
# default: build the release binary in $CARGO_TARGET_DIR, default
# ~/.cache/eventfold/target-peers), plus pg.sh's EF_PG_DIR / EF_PG_PORT.
# A PostgreSQL that was already running is left running; one this script started is stopped.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LISTEN=${EF_PEER_LISTEN:-127.0.0.1:18090}
BASE="http://$LISTEN"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eventfold/target-peers}
PEER_LOG=$(mktemp /tmp/cqrs-peer-smoke.XXXXXX.log)
PEER_PID=
PG_STARTED=0
FAILED=0

cleanup() {
    local rc=$?
    if [[ -n $PEER_PID ]] && kill -0 "$PEER_PID" 2>/dev/null; then
        kill "$PEER_PID" 2>/dev/null || true
        wait "$PEER_PID" 2>/dev/null || true
    fi
    if [[ $PG_STARTED -eq 1 ]]; then
        "$HERE/pg.sh" stop || rc=1
    fi
    if [[ $rc -ne 0 ]]; then
        echo "--- peer log ($PEER_LOG) ---" >&2
        tail -n 30 "$PEER_LOG" >&2 || true
        echo "smoke: FAILED" >&2
    else
        rm -f "$PEER_LOG"
    fi
    exit "$rc"
}
trap cleanup EXIT

if [[ -n ${EF_PEER_BIN:-} ]]; then
    BIN=$EF_PEER_BIN
else
    (cd "$HERE" && cargo build --release --quiet)
    BIN=$CARGO_TARGET_DIR/release/cqrs-peer
fi

if ! "$HERE/pg.sh" status >/dev/null; then
    PG_STARTED=1
fi
"$HERE/pg.sh" start

"$BIN" --listen "$LISTEN" --database-url "$("$HERE/pg.sh" url)" --pool-size 4 >"$PEER_LOG" 2>&1 &
PEER_PID=$!
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "$BASE/healthz" 2>/dev/null && break
    kill -0 "$PEER_PID" 2>/dev/null || { echo "smoke: the peer exited" >&2; exit 1; }
    sleep 0.1
done
curl -fsS -o /dev/null "$BASE/healthz" || { echo "smoke: the peer does not answer /healthz" >&2; exit 1; }

ID="smoke-$(date +%s%N)"
PASSED=0

# check NAME EXPECTED_STATUS EXPECTED_BODY_SUBSTRING METHOD PATH [BODY [CURL_ARGS...]]
check() {
    local name=$1 want=$2 want_body=$3 method=$4 path=$5 body=${6:-}
    shift 6 || shift $#
    local out status
    out=$(mktemp)
    if [[ $method == POST ]]; then
        status=$(curl -sS -o "$out" -w '%{http_code}' -X POST -H 'content-type: application/json' \
            -H "Idempotency-Key: smoke-$RANDOM-$RANDOM" "$@" --data "$body" "$BASE$path")
    else
        status=$(curl -sS -o "$out" -w '%{http_code}' "$@" "$BASE$path")
    fi
    local got
    got=$(cat "$out")
    rm -f "$out"
    if [[ $status != "$want" || $got != *"$want_body"* ]]; then
        echo "FAIL $name: want $want with …$want_body…, got $status $got" >&2
        FAILED=$((FAILED + 1))
    else
        echo "ok   $name: $status $got"
        PASSED=$((PASSED + 1))
    fi
}

P="/v1/aggregates/order/$ID"
check "PlaceOrder" 200 '"version":1' POST "$P/commands" \
    '{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"sku-1","qty":2,"price_cents":150}]}'
check "AddItem" 200 '"version":2' POST "$P/commands" '{"type":"AddItem","sku":"sku-2","qty":1,"price_cents":25}'
check "ConfirmOrder" 200 '"version":3' POST "$P/commands" '{"type":"ConfirmOrder"}'
check "PlaceOrder again" 422 '"error":"already_placed"' POST "$P/commands" \
    '{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"sku-1","qty":1,"price_cents":1}]}'
check "AddItem after confirm" 422 '"error":"not_placed"' POST "$P/commands" \
    '{"type":"AddItem","sku":"x","qty":1,"price_cents":1}'
check "ShipOrder" 200 '"version":4' POST "$P/commands" '{"type":"ShipOrder"}'
check "CancelOrder after ship" 422 '"error":"invalid_transition"' POST "$P/commands" '{"type":"CancelOrder","reason":"late"}'
check "ConfirmOrder on a missing order" 422 '"error":"order_not_found"' POST "/v1/aggregates/order/$ID-missing/commands" \
    '{"type":"ConfirmOrder"}'
check "unknown command type" 400 '"error":"unknown_command_type"' POST "$P/commands" '{"type":"Nope"}'
check "malformed JSON" 400 '"error":"malformed_command"' POST "$P/commands" '{"type":'
check "unknown field" 400 '"error":"malformed_command"' POST "$P/commands" '{"type":"CancelOrder","reason":"x","oops":1}'
check "unknown aggregate type" 404 '"error":"unknown_aggregate_type"' POST "/v1/aggregates/nope/$ID/commands" '{"type":"X"}'
check "If-Match refused" 400 '"error":"if_match_unsupported"' POST "$P/commands" '{"type":"ShipOrder"}' -H 'If-Match: "4"'
check "GET state" 200 '"status":"shipped","customer_id":"c1"' GET "$P"
check "GET state version" 200 '"version":4' GET "$P"
check "GET state total" 200 '"total_cents":325' GET "$P"
check "GET missing" 404 '"error":"aggregate_not_found"' GET "$P-missing"

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
