#!/usr/bin/env python3
"""A Kafka-mode shop's run, window by window: which windows had slow commands, and what
the shop, its transactions and the broker were doing then.

    bench/timeline.py URL SHOP_PID BROKER_PID OUT [--interval S]

Every S seconds (default 0.5) until stopped (SIGTERM or SIGINT), it reads the shop's
/metrics and every thread's CPU time of both processes (/proc/<pid>/task/*/stat), and
appends one line per window to OUT (tab-separated, with a header):

- t_s: the window's end, in seconds since the first reading;
- commands: commands the shop finished in the window; slow: those over 50 ms (the
  `eventfold_command_latency_seconds` histogram's 0.05 bucket; the histogram is not read
  atomically, so a window may be off by one);
- tx: transactions committed; produce, send_offsets, delivery, commit, local_write: the
  milliseconds the transactions spent in each stage (`eventfold_log_transaction_stage_
  seconds_total`);
- shop_ticks, broker_ticks: CPU ticks (1/CLK_TCK s) of each process; a half-second
  offers 50 per core;
- other_ticks: the ticks the machine's CPUs were busy with anything else (the load
  generator, the kernel's own threads, other processes; `/proc/stat` less the two);
  steal: ticks the hypervisor ran something else on this machine's virtual CPUs while
  they had work (`/proc/stat`'s steal), which no process here can see as its own;
- store_bg: ticks of the shop's store background threads (fjall's flush and compaction
  workers, lsm-tree's `lsm-garbage`); broker_gc: of the broker's collector threads (G1's
  `GC Thread`, `G1 ...`); broker_jit: of its JIT compiler threads;
- shop_top, broker_top: its four busiest thread names with their ticks (numbers in names
  dropped, so a pool's threads add up).

`bench/kafka-run.sh` starts it over the measured run with TIMELINE=1 and prints a summary
line (windows with slow commands, and what was busiest in them), `bench/run.py --timeline`
over the kafka scenario's HTTP 5,000/s runs; both summarize with `summary`.
"""
import collections
import glob
import os
import re
import signal
import sys
import time
import urllib.request

STAGES = ("produce", "send_offsets", "delivery", "commit", "local_write")


def metrics(url):
    """(commands, commands over 50 ms, transactions, {stage: seconds}), cumulative; None
    when the shop does not answer."""
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
    except OSError:
        return None
    count = fast = tx = 0.0
    stages = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("eventfold_command_latency_seconds_count{"):
            count += float(value)
        elif name.startswith("eventfold_command_latency_seconds_bucket{") and 'le="0.05"' in name:
            fast += float(value)
        elif name.startswith("eventfold_log_group_commits_total{"):
            tx += float(value)
        elif name.startswith("eventfold_log_transaction_stage_seconds_total{"):
            stage = re.search(r'stage="([^"]+)"', name)
            if stage:
                stages[stage.group(1)] = float(value)
    return count, count - fast, tx, stages


def machine():
    """(busy ticks, stolen ticks) of all CPUs together, cumulative (`/proc/stat`)."""
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6], cpu[7]


def threads(pid):
    """Thread name (numbers dropped) -> CPU ticks, summed over the process's threads."""
    ticks = collections.Counter()
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(task + "/comm") as f:
                name = re.sub(r"[\d#-]+$", "", f.read().strip()) or "?"
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[name] += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return ticks


# Thread groups with a column of their own: column -> (process, name prefixes after
# `threads`' renaming).
GROUPS = {"store_bg": ("shop", ("fjall:worker", "lsm-garbage")),
          "broker_gc": ("broker", ("GC Thread", "G1 ")),
          "broker_jit": ("broker", ("C1 CompilerThre", "C2 CompilerThre"))}


def group(diff, prefixes):
    return sum(n for name, n in diff.items() if name.startswith(prefixes))


def top(diff):
    return ", ".join(f"{name}:{n}" for name, n in diff.most_common(4) if n > 0)


# What may hold commands up in a window: (label, column, ticks that count).
KINDS = (("store background", "store_bg", 5), ("broker GC", "broker_gc", 3), ("broker JIT", "broker_jit", 5),
         ("steal", "steal", 5))


def summary(path, worst=5):
    """What a file of this script says: its windows, those with commands over 50 ms and
    the `worst` of them (most such commands, whole rows), and for the windows with 100 or
    more, how many ran each of `KINDS` in them or in the window before (a command held up
    late in one window finishes in the next), and how many ran none of them."""
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    win = [dict(zip(rows[0], r)) for r in rows[1:]]
    slow = [w for w in win if int(w["slow"]) > 0]
    big = [i for i, w in enumerate(win) if int(w["slow"]) >= 100]
    # Files written before a column existed count it as 0.
    ran = {label: [any(int(win[j].get(col, 0)) >= least for j in (i - 1, i) if j >= 0) for i in big]
           for label, col, least in KINDS}
    return {"windows": len(win), "slow_windows": len(slow), "windows_100_slow": len(big),
            "in_or_before_100_slow": {**{label: sum(flags) for label, flags in ran.items()},
                                      "none of these": sum(not any(flags) for flags in zip(*ran.values()))},
            "worst": sorted(slow, key=lambda w: -int(w["slow"]))[:worst]}


def main():
    args = sys.argv[1:]
    interval = 0.5
    if "--interval" in args:
        i = args.index("--interval")
        interval = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 4:
        sys.exit(__doc__)
    url, shop_pid, broker_pid, out = args[0].rstrip("/"), int(args[1]), int(args[2]), args[3]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    with open(out, "w") as f:
        f.write("\t".join(("t_s", "commands", "slow", "tx", *STAGES, "shop_ticks", "broker_ticks",
                           "other_ticks", "steal", *GROUPS, "shop_top", "broker_top")) + "\n")
        start = time.monotonic()
        prev = None
        while not stop:
            now = time.monotonic()
            m, s, b, c = metrics(url), threads(shop_pid), threads(broker_pid), machine()
            if m is not None:
                if prev is not None:
                    pm, ps, pb, pc = prev
                    # Counter subtraction keeps positive counts.
                    diff = {"shop": s - ps, "broker": b - pb}
                    stage_ms = [f"{(m[3].get(k, 0) - pm[3].get(k, 0)) * 1e3:.0f}" for k in STAGES]
                    groups = [str(group(diff[proc], prefixes)) for proc, prefixes in GROUPS.values()]
                    shop_ticks, broker_ticks = sum(diff["shop"].values()), sum(diff["broker"].values())
                    # The process and machine counters are read a moment apart: not below 0.
                    other = max(c[0] - pc[0] - shop_ticks - broker_ticks, 0)
                    f.write("\t".join((f"{now - start:.1f}", f"{m[0] - pm[0]:.0f}", f"{max(m[1] - pm[1], 0):.0f}",
                                       f"{m[2] - pm[2]:.0f}", *stage_ms, str(shop_ticks), str(broker_ticks),
                                       str(other), str(c[1] - pc[1]), *groups,
                                       top(diff["shop"]), top(diff["broker"]))) + "\n")
                    f.flush()
                prev = (m, s, b, c)
            if not os.path.exists(f"/proc/{shop_pid}"):
                break
            time.sleep(max(0.0, interval - (time.monotonic() - now)))


if __name__ == "__main__":
    main()
