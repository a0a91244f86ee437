#!/usr/bin/env python3
"""Which threads were busy while a benchmark ran, and how busy.

    bench/threads.py watch REPORT [TOP]

samples every thread on the machine (/proc/PID/task/TID/stat) four times
a second until it gets SIGTERM or SIGINT, then writes to REPORT the TOP
(default 8) threads that spent the most CPU time meanwhile: process and
thread names, CPU-seconds, and the share of one CPU over the time the
thread was seen. A thread near 100 % bounds whatever runs through it; a
client's thread at 100 % while the server's are not says the client sets
the pace (bench/trace.sh's TRACE_THREADS).

A thread seen at the first sample counts from that sample's value; one
that appears later counts from zero, since it started within the watch.
A thread that exits between samples loses its last quarter second.
"""

import os
import signal
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
PERIOD = 0.25


def comm(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def sample():
    """{(pid, tid): (ticks, process name, thread name)} for every thread."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        pname = None
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # The name is in parentheses and may hold spaces; the
            # fields after it start at state (field 3).
            close = stat.rfind(")")
            name = stat[stat.find("(") + 1 : close]
            fields = stat[close + 2 :].split()
            ticks = int(fields[11]) + int(fields[12])  # utime, stime
            if pname is None:
                pname = comm(f"/proc/{pid}/comm")
            out[(int(pid), int(tid))] = (ticks, pname, name)
    return out


def main():
    if len(sys.argv) < 3 or sys.argv[1] != "watch":
        sys.exit(__doc__)
    report, top = sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    first = sample()
    t0 = time.monotonic()
    seen = {}  # key -> [first ticks, last ticks, first time, last time, pname, tname]
    for key, (ticks, pname, tname) in first.items():
        seen[key] = [ticks, ticks, t0, t0, pname, tname]
    while not stop:
        time.sleep(PERIOD)
        now = time.monotonic()
        for key, (ticks, pname, tname) in sample().items():
            s = seen.get(key)
            if s is None:
                seen[key] = [0, ticks, now - PERIOD, now, pname, tname]
            else:
                s[1], s[3], s[5] = ticks, now, tname
    wall = time.monotonic() - t0
    rows = []
    for (pid, tid), (a, b, ta, tb, pname, tname) in seen.items():
        cpu = (b - a) / TICK
        if cpu > 0:
            rows.append((cpu, pid, tid, pname, tname, cpu / max(tb - ta, PERIOD)))
    rows.sort(reverse=True)
    with open(report, "w") as f:
        f.write(f"threads over {wall:.1f} s: process/thread (pid/tid): CPU-s, share of one CPU while seen\n")
        for cpu, pid, tid, pname, tname, busy in rows[:top]:
            f.write(f"  {pname}/{tname} ({pid}/{tid}): {cpu:.2f} CPU-s, {100 * busy:.0f} %\n")


if __name__ == "__main__":
    main()
