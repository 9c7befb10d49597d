#!/usr/bin/env python3
"""Resident memory of the embedded shop under a long run of new orders (issue 57).

Starts a release `shop` on the embedded log (fsync on, default flags but the address and a
fresh data directory, plus any --shop-arg), drives `eventfold load` (the shop-orders
preset: PlaceOrder on a fresh order per request) for --count commands over HTTP at full
rate, and samples the shop's `VmRSS`/`VmHWM` (/proc/<pid>/status) and the aggregates its
partitions keep cached (`eventfold_partition_cached_aggregates` in /metrics) every
--every seconds. Prints one JSON document: the samples, the figures at the end of the
load, after --settle seconds more, and the load tool's own result.

Usage:
  bench/memory.py                                   # this build, 1,000,000 orders
  bench/memory.py --shop ~/.cache/eventfold/base-a1238f6/shop --count 200000
  bench/memory.py --shop-arg=--cache-limit --shop-arg=50000 --out /tmp/mem.json

The binaries default to $CARGO_TARGET_DIR/release (or target/release).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[memory {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of `pid`, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0])
    return out


def metrics(url: str) -> dict[str, float]:
    """Sums of the /metrics families this script reports."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(eventfold_partition_cached_aggregates|eventfold_commands_total)(\{[^}]*\})? (\S+)$", line)
        if m:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    return sums


def journal_kib(data: Path) -> int:
    """Bytes of the store's journals (`*.jnl`), in KiB: writes not yet flushed out of
    the memtables are in them (spare journals, zero-filled ahead, count too)."""
    total = 0
    for p in data.rglob("*.jnl"):
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total // 1024


def snapshot(pid: int, url: str, t0: float, data: Path) -> dict:
    s = {"t": round(time.monotonic() - t0, 1), **status_kib(pid), "journal_kib": journal_kib(data)}
    try:
        m = metrics(url)
        s["cached_aggregates"] = int(m.get("eventfold_partition_cached_aggregates", 0))
        s["commands"] = int(m.get("eventfold_commands_total", 0))
    except (urllib.error.URLError, OSError, ValueError):
        pass
    return s


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"the shop exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    sys.exit(f"the shop was not ready within {timeout} s")


def main() -> None:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shop", type=Path, default=target / "shop", help="shop binary")
    ap.add_argument("--eventfold", type=Path, default=target / "eventfold", help="the eventfold tool (load)")
    ap.add_argument("--count", type=int, default=1_000_000, help="commands to send (1,000,000)")
    ap.add_argument("--concurrency", type=int, default=64, help="load connections (64)")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples (1)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to sample after the load (10)")
    ap.add_argument("--shop-arg", action="append", default=[], help="an extra shop argument (repeatable)")
    ap.add_argument("--work", type=Path, help="directory for the data dir and the shop's log (a temporary one)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    a = ap.parse_args()
    for b in (a.shop, a.eventfold):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b}: not an executable file (build with cargo build --release -p shop -p eventfold-tools)")
    if a.count < 1 or a.concurrency < 1 or a.every <= 0 or a.settle < 0:
        sys.exit("--count and --concurrency must be at least 1, --every above 0, --settle at least 0")

    work = a.work or Path(tempfile.mkdtemp(prefix="eventfold-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(a.shop), "--http", f"127.0.0.1:{port}", "--data-dir", str(data), *a.shop_arg]
    log("$ " + " ".join(cmd))
    shop_log = open(work / "shop.log", "ab")
    shop = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=shop_log, env={**os.environ, "RUST_LOG": "warn"})
    samples: list[dict] = []
    try:
        wait_ready(url, shop, 60)
        t0 = time.monotonic()
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(a.every):
                samples.append(snapshot(shop.pid, url, t0, data))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = [str(a.eventfold), "load", "--url", url, "--json", "--quiet",
                "--concurrency", str(a.concurrency), "--count", str(a.count)]
        log("$ " + " ".join(load))
        result = json.loads(subprocess.run(load, check=True, stdout=subprocess.PIPE, text=True).stdout)
        at_end = snapshot(shop.pid, url, t0, data)
        time.sleep(a.settle)
        stop.set()
        sampler.join()
        settled = snapshot(shop.pid, url, t0, data)
    finally:
        shop.terminate()
        try:
            shop.wait(30)
        except subprocess.TimeoutExpired:
            shop.kill()
            shop.wait()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    peak_cached = max((s.get("cached_aggregates", 0) for s in samples), default=0)
    doc = {
        "shop": str(a.shop),
        "shop_args": a.shop_arg,
        "count": a.count,
        "concurrency": a.concurrency,
        "throughput": result.get("throughput_per_s"),
        "requests": result.get("requests"),
        "failed": result.get("failed"),
        "status": result.get("status"),
        "at_end": at_end,
        "settled": settled,
        "peak_cached_aggregates": peak_cached,
        "samples": samples,
    }
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    mib = 1024
    log(f"end: RSS {at_end['VmRSS'] / mib:.0f} MiB, peak {at_end['VmHWM'] / mib:.0f} MiB, "
        f"cached {at_end.get('cached_aggregates')}; settled: RSS {settled['VmRSS'] / mib:.0f} MiB; "
        f"peak cached {peak_cached}; {result.get('throughput')} commands/s")


if __name__ == "__main__":
    main()
