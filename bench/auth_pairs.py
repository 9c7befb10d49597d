#!/usr/bin/env python3
"""Auth on against auth off (issue 56): the shop embedded over HTTP, `eventfold load` at
full rate, runs in alternated pairs (off-on, on-off, off-on, ...) with the same binaries in one sitting,
each on a fresh data directory. Auth on: `--auth-tokens` with one write token and
a rate limit of a million requests a second (so the limiter's bucket is taken on every
request, and never refuses at these rates), the load sending the token.

    bench/auth_pairs.py --bin target/release --pairs 3 --duration 10s --concurrency 64

Prints each run, then the pairs and the medians, as JSON lines on stdout; the last line is the summary.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TOKEN = "bench-token-0123456789abcdef"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.05)
    sys.exit(f"{url} not ready within {timeout} s")


def one_run(args, auth, work):
    data = tempfile.mkdtemp(dir=work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [os.path.join(args.bin, "shop"), "--data-dir", data, "--http", f"127.0.0.1:{port}"]
    if auth:
        tokens = os.path.join(work, "tokens")
        line = subprocess.run([os.path.join(args.bin, "shop"), "auth", "hash-token", "bench", "write"],
                              input=TOKEN + "\n", text=True, stdout=subprocess.PIPE, check=True).stdout
        with open(tokens, "w") as f:
            f.write(line)
        cmd += ["--auth-tokens", tokens, "--rate-limit-per-token", "1000000", "--rate-limit-burst", "1000000"]
    shop = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "EVENTFOLD_LOG": "warn"})
    try:
        wait_ready(url)
        load = [os.path.join(args.bin, "eventfold"), "load", "--url", url, "--json", "--quiet",
                "--concurrency", str(args.concurrency), "--duration", args.duration, "--warmup", args.warmup]
        env = {**os.environ}
        if auth:
            env["EVENTFOLD_TOKEN"] = TOKEN
        out = subprocess.run(load, stdout=subprocess.PIPE, text=True, env=env)
        summary = json.loads(out.stdout)
    finally:
        shop.terminate()
        shop.wait()
    ok = summary["status"].get("200", 0)
    assert ok == summary["requests"], f"not every request succeeded: {summary['status']}"
    return {
        "auth": auth,
        "rate": round(summary["throughput_per_s"], 1),
        "p99_ms": summary["latency_ms"]["p99"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--duration", default="10s")
    p.add_argument("--warmup", default="2s")
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="eventfold-auth-bench-") as work:
        for i in range(args.pairs):
            # The order alternates from pair to pair (off-on, on-off, ...), so that a
            # drift of the machine over the sitting does not favour one side.
            order = (False, True) if i % 2 == 0 else (True, False)
            for auth in order:
                r = one_run(args, auth, work)
                r["pair"] = i + 1
                runs.append(r)
                print(json.dumps(r), flush=True)
    pairs = []
    for i in range(args.pairs):
        off = next(r for r in runs if r["pair"] == i + 1 and not r["auth"])
        on = next(r for r in runs if r["pair"] == i + 1 and r["auth"])
        pairs.append({"pair": i + 1, "off": off["rate"], "on": on["rate"], "on_over_off": round(on["rate"] / off["rate"], 3)})
    med = {}
    for auth in (False, True):
        rs = [r for r in runs if r["auth"] == auth]
        rates = [r["rate"] for r in rs]
        med["on" if auth else "off"] = {
            "rate": statistics.median(rates),
            "p99_ms": statistics.median(r["p99_ms"] for r in rs),
            # (max - min) / median of the side's runs.
            "spread": round((max(rates) - min(rates)) / statistics.median(rates), 3),
        }
    med["on_over_off"] = round(med["on"]["rate"] / med["off"]["rate"], 3)
    print(json.dumps({"pairs": pairs, "medians": med}), flush=True)

if __name__ == "__main__":
    main()
