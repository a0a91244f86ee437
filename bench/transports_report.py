#!/usr/bin/env python3
"""The report of bench/transports.sh: reads what the guest sent on its
second serial port (bench/transports-guest.sh's T- lines and fio's JSON),
the traces' counts (their .env files) and the run's parameters
(NAME=VALUE arguments); writes OUTDIR/report.md (markdown) and
OUTDIR/results.txt (a line per measurement), and prints the report.

Usage: transports_report.py RESULTS ENVDIR OUTDIR [NAME=VALUE...]
"""
import json
import os
import statistics
import sys

USER_HZ = 100  # /proc/stat's unit on x86 Linux
NAMES = {"zram": "zram", "nbd": "gzramd-nbd", "ublk": "gzramd-ublk"}


def busy(f):
    # user nice system idle iowait irq softirq steal: all but idle, iowait
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]


def parse(path):
    runs, foot, guest, cur = {}, [], {}, None
    lines = open(path, errors="replace").read().splitlines()
    i = 0
    while i < len(lines):
        f = lines[i].split()
        i += 1
        if not f:
            continue
        if f[0] == "T-GUEST":
            guest = dict(x.split("=", 1) for x in f[1:] if "=" in x)
        elif f[0] == "T-UBLK":
            guest["ublk"] = " ".join(f[1:])
        elif f[0] == "T-FOOT":
            foot.append({"dev": f[1], "round": int(f[2]), "rss": int(f[3]), "pss": int(f[4]),
                         "procs": int(f[5]), "threads": int(f[6]), "anon": int(f[7]), "file": int(f[8]),
                         "locked": int(f[9]), "gzticks": int(f[10]), "busyticks": int(f[11]), "idle_s": float(f[12])})
        elif f[0] == "T-BEGIN":
            runs[f[1]] = {"dev": f[2], "wl": f[3], "jobs": int(f[4]), "round": int(f[5]),
                          "gz0": int(f[6]), "cpu0": [int(x) for x in f[7:]]}
        elif f[0] == "T-CLOCK":
            runs[f[1]][f[2]] = (float(f[3]), float(f[4]))
        elif f[0] == "T-END":
            r = runs[f[1]]
            r["gz1"], r["cpu1"] = int(f[2]), [int(x) for x in f[3:]]
        elif f[0] == "T-JSON-BEGIN":
            cur, body = f[1], []
            while i < len(lines) and not lines[i].startswith("T-JSON-END"):
                body.append(lines[i])
                i += 1
            i += 1
            runs[cur]["json"] = json.loads("\n".join(body))
    return runs, foot, guest


def envs(d):
    out = {}
    for name in os.listdir(d):
        if name.endswith(".env"):
            out[name[:-4]] = {k: float(v) for k, v in (x.split("=") for x in open(os.path.join(d, name)).read().split())}
    return out


def measure(r, traces, repeat, ncpu):
    job = r["json"]["jobs"][0]
    rd, wr = job["read"], job["write"]
    moved = rd["io_bytes"] + wr["io_bytes"]
    d = [b - a for a, b in zip(r["cpu0"], r["cpu1"])]
    cpu_s = busy(d) / USER_HZ
    main = rd if rd["io_bytes"] >= wr["io_bytes"] else wr
    # Total latency, submission to completion (lat_percentiles=1): with
    # libaio zram does its work inside io_submit, which fio's clat leaves
    # out (2 µs at QD1 under TCG), and NBD and ublk part of theirs.
    pct = main.get("lat_ns", {}).get("percentile") or main.get("clat_ns", {}).get("percentile", {})
    m = {
        "mbps": (rd["bw_bytes"] + wr["bw_bytes"]) / 1e6,
        "cpu": cpu_s / (moved / 1e9) if moved else 0,
        "gzcpu": (r["gz1"] - r["gz0"]) / USER_HZ / (moved / 1e9) if moved else 0,
        "p50": pct.get("50.000000", 0) / 1e3,
        "p99": pct.get("99.000000", 0) / 1e3,
        "busy": 100.0 * busy(d) / sum(d) if sum(d) else 0,
        "iowait": 100.0 * d[4] / sum(d) if sum(d) else 0,
        "bytes": moved,
        # The share of the vCPUs' time that /proc/stat's ticks cover over
        # the run (wall by the guest's uptime), and the CPU by the
        # scheduler's clock (/proc/schedstat), per GB.
        "cover": 0, "schedcpu": 0,
        # job_runtime sums the jobs' run times (group_reporting)
        "runtime": job.get("job_runtime", 0) / 1000 / r["jobs"],
    }
    if "begin" in r and "end" in r:
        wall = r["end"][0] - r["begin"][0]
        if wall > 0:
            m["cover"] = 100.0 * sum(d[:8]) / USER_HZ / (wall * ncpu)
        if moved and r["end"][1] > 0:
            m["schedcpu"] = (r["end"][1] - r["begin"][1]) / 1e9 / (moved / 1e9)
    if r["wl"].startswith("trace:"):
        e = traces[r["wl"][6:]]
        m["expected"] = r["jobs"] * repeat * (e["read_bytes"] + e["write_bytes"])
    else:
        m["expected"] = 0
    return m


def jn(j):
    return "1 job" if j == 1 else "%d jobs" % j


def ratio(a, b):
    return a / b if b else float("nan")


def fmt(x, nd=2):
    return "-" if x != x else "%.*f" % (nd, x)


def main():
    raw, envdir, outdir = sys.argv[1:4]
    p = dict(a.split("=", 1) for a in sys.argv[4:])
    repeat = int(p.get("repeat", 1))
    runs, foot, guest = parse(raw)
    traces = envs(envdir)
    rows = {}
    lines = []
    for rid in sorted(runs, key=int):
        r = runs[rid]
        if "json" not in r or "cpu1" not in r:
            continue
        m = measure(r, traces, repeat, int(guest.get("cpus", 1)))
        rows.setdefault((r["wl"], r["jobs"], r["dev"]), []).append(m)
        lines.append("transports device=%s workload=%s jobs=%d round=%d mbps=%.1f cpu_s_per_gb=%.3f "
                     "gzramd_cpu_s_per_gb=%.3f p50_us=%.1f p99_us=%.1f bytes=%.0f expected_bytes=%.0f "
                     "busy_pct=%.1f iowait_pct=%.1f runtime_s=%.2f tick_cover_pct=%.0f sched_cpu_s_per_gb=%.3f" % (
                         NAMES[r["dev"]], r["wl"], r["jobs"], r["round"], m["mbps"], m["cpu"], m["gzcpu"],
                         m["p50"], m["p99"], m["bytes"], m["expected"], m["busy"], m["iowait"], m["runtime"],
                         m["cover"], m["schedcpu"]))
    for f in foot:
        lines.append("transports-footprint device=%s round=%d rss_kib=%d pss_kib=%d anon_kib=%d file_kib=%d "
                     "processes=%d threads=%d idle_s=%g gzramd_idle_cpu_pct=%.1f guest_idle_busy_pct=%.1f" % (
                         NAMES[f["dev"]], f["round"], f["rss"], f["pss"], f["anon"], f["file"], f["procs"],
                         f["threads"], f["idle_s"], 100.0 * f["gzticks"] / USER_HZ / f["idle_s"],
                         100.0 * f["busyticks"] / USER_HZ / f["idle_s"]))
    med = {k: {x: statistics.median(m[x] for m in v) for x in v[0]} for k, v in rows.items()}
    rounds = max((len(v) for v in rows.values()), default=0)
    devs = [d for d in ("zram", "nbd", "ublk") if any(k[2] == d for k in med)]
    wls = []
    for k in med:
        if (k[0], k[1]) not in wls and k[0] != "fill":
            wls.append((k[0], k[1]))
    wls.sort(key=lambda w: (not w[0].startswith("trace:"), w[0], w[1]))

    out = []
    w = out.append
    w("# Transports in one 6.12 guest: kernel zram, gzramd over the kernel's NBD client, gzramd over ublk")
    w("")
    w("Guest: Debian's kernel %s under QEMU (%s%s), %s vCPUs, %s kB of memory; one boot for every device. "
      "Host: %s, load average %s before the boot and %s after; %s; gzramd %s." % (
          guest.get("kernel", "?"), p.get("accel"), ", TCG thread=" + p.get("tcg_thread", "?") if p.get("accel") == "tcg" else "",
          guest.get("cpus", "?"), guest.get("mem_kb", "?"), p.get("host"), p.get("load0"), p.get("load1"), p.get("date"), p.get("gzramd")))
    tr = "; ".join("%s: %d reads, %d writes (%.0f MB read, %.0f MB written a copy), %d trims left out" % (
        n, e["reads"], e["writes"], e["read_bytes"] / 1e6, e["write_bytes"] / 1e6, e["trims_left_out"])
        for n, e in sorted(traces.items()))
    w("Devices of %s MiB: zram with %s (the algorithms this kernel's zram has: %s); gzramd `serve %s` over "
      "`--device /dev/nbd0 --kernel-connections %s` and over `--transport ublk --device auto` (%s queues: "
      "one per vCPU, at most 4; %s). Each run on a fresh device." % (
          p.get("size_mib"), p.get("zalg"), guest.get("zram_algs", "?").replace("/", " "), p.get("gargs"),
          guest.get("kconns", "?"), min(int(guest.get("cpus", 1)), 4), guest.get("ublk", "?")))
    w("Traces (%s), replayed by fio %s with libaio and O_DIRECT on the device: read_iolog, replay_no_stall=1, "
      "iodepth=%s, each job the trace %d time(s) over, buffer_compress_percentage=50; trims left out "
      "(fio 3.33 replays none). QD1: %s MiB written (64 KiB, iodepth 16), then 4 KiB random reads at "
      "iodepth 1 for %s s." % (tr, guest.get("fio", "?"), p.get("iodepth"), repeat, p.get("qd1_mib"), p.get("qd1_s")))
    w("CPU-s/GB: the guest's user+nice+system+irq+softirq+steal (its /proc/stat, all vCPUs) over the fio run, "
      "per 10^9 bytes read and written; fio's own CPU and the kernel's are in it, for every device alike; "
      "gzramd's: its processes' utime+stime. busy: that CPU as a share of the ticks counted. ticks cover: "
      "the ticks /proc/stat counted over the run against the vCPUs' wall time (the guest's uptime); under "
      "TCG below 100% where the host took a vCPU's thread away. CPU-s/GB by schedstat: the time the guest's "
      "tasks ran by the scheduler's clock (/proc/schedstat), which counts such time, per GB. Latency: "
      "the reads' total latency, submission to completion (fio's lat with lat_percentiles=1, µs): "
      "its clat alone leaves out what a device does inside io_submit, which for zram is everything.")
    if rounds > 1:
        w("Each figure is the median of %d rounds (every other round in the reverse order)." % rounds)
    w("")
    w("| workload | jobs | device | MB/s | CPU-s/GB | gzramd's CPU-s/GB | p50 µs | p99 µs | busy | ticks cover | CPU-s/GB by schedstat | bytes moved (of the trace's) |")
    w("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wl, j in wls:
        for d in devs:
            m = med.get((wl, j, d))
            if not m:
                continue
            moved = "%.2f GB" % (m["bytes"] / 1e9)
            if m["expected"]:
                moved += " (%.3f)" % (m["bytes"] / m["expected"])
            w("| %s | %d | %s | %.0f | %.2f | %s | %.0f | %.0f | %.0f%% | %.0f%% | %.2f | %s |" % (
                wl, j, NAMES[d], m["mbps"], m["cpu"], "%.2f" % m["gzcpu"] if d != "zram" else "-",
                m["p50"], m["p99"], m["busy"], m["cover"], m["schedcpu"], moved))
    w("")
    w("Ratios (ublk over the kernel's NBD client, and over zram):")
    w("")
    w("| workload | jobs | ublk/nbd MB/s | ublk/nbd CPU-s/GB | ublk/nbd p50 | ublk/nbd p99 | ublk/zram MB/s | ublk/zram CPU-s/GB | ublk/zram p50 | ublk/zram p99 |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nan = float("nan")
    for wl, j in wls:
        u = med.get((wl, j, "ublk"))
        cells = []
        for o in ("nbd", "zram"):
            b = med.get((wl, j, o))
            for x in ("mbps", "cpu", "p50", "p99"):
                cells.append(fmt(ratio(u[x], b[x]) if u and b else nan))
        w("| %s | %d | %s |" % (wl, j, " | ".join(cells)))
    w("")
    fp = {}
    for f in foot:
        fp.setdefault(f["dev"], []).append(f)
    if fp:
        w("gzramd's idle memory %gs after its start (its processes, before any I/O), and the CPU it and the "
          "whole guest spent over those seconds (%% of one vCPU):" % fp[next(iter(fp))][0]["idle_s"])
        w("")
        w("| device | RSS MiB | PSS MiB | anonymous MiB | file MiB | processes | threads | gzramd idle CPU | guest idle CPU |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for d in ("nbd", "ublk"):
            if d in fp:
                v = fp[d]

                def md(x):
                    return statistics.median(f[x] for f in v)
                w("| %s | %.1f | %.1f | %.1f | %.1f | %d | %d | %.1f%% | %.1f%% |" % (
                    NAMES[d], md("rss") / 1024, md("pss") / 1024, md("anon") / 1024, md("file") / 1024,
                    v[0]["procs"], v[0]["threads"],
                    100.0 * md("gzticks") / USER_HZ / v[0]["idle_s"], 100.0 * md("busyticks") / USER_HZ / v[0]["idle_s"]))
        w("")

    # Issue 38's targets.
    w("Targets (issue 38, item 5):")
    w("")
    verdicts = []

    def target(text, ok):
        verdicts.append(ok)
        w("- %s: %s" % (text, "-" if ok is None else ("met" if ok else "MISSED")))

    for wl, j in wls:
        if not wl.startswith("trace:"):
            continue
        u, n, z = (med.get((wl, j, d)) for d in ("ublk", "nbd", "zram"))
        if u and n:
            target("%s, %s: CPU-s/GB ublk ≤ 0.6× NBD's (%.2f / %.2f = %.2f)" % (wl, jn(j), u["cpu"], n["cpu"], u["cpu"] / n["cpu"]),
                   u["cpu"] <= 0.6 * n["cpu"])
        if u and z:
            target("%s, %s: CPU-s/GB ublk ≤ 1.2× zram's (%.2f / %.2f = %.2f)" % (wl, jn(j), u["cpu"], z["cpu"], u["cpu"] / z["cpu"]),
                   u["cpu"] <= 1.2 * z["cpu"])
        if j == 4 and u and n:
            target("%s, 4 jobs: MB/s ublk ≥ NBD's (%.0f / %.0f = %.2f)" % (wl, u["mbps"], n["mbps"], u["mbps"] / n["mbps"]),
                   u["mbps"] >= n["mbps"])
    u, n = med.get(("qd1-randread-4k", 1, "ublk")), med.get(("qd1-randread-4k", 1, "nbd"))
    if u and n:
        for x in ("p50", "p99"):
            target("QD1 4 KiB random reads: %s ublk ≤ 0.6× NBD's (%.0f / %.0f µs = %.2f)" % (x, u[x], n[x], u[x] / n[x]),
                   u[x] <= 0.6 * n[x])
    if "ublk" in fp and "nbd" in fp:
        for x, name in (("rss", "RSS"), ("pss", "PSS")):
            a = statistics.median(f[x] for f in fp["ublk"]) / 1024
            b = statistics.median(f[x] for f in fp["nbd"]) / 1024
            target("idle footprint: ublk's %s ≤ NBD's + 4 MiB (%.1f against %.1f MiB)" % (name, a, b), a <= b + 4)
    w("")
    w("Guest wall time %s s. Command: `%s`" % (p.get("guest_wall"), p.get("command")))
    w("")
    w("One line per measurement (also in results.txt):")
    w("")
    w("```")
    out.extend(lines)
    w("```")
    text = "\n".join(out) + "\n"
    open(os.path.join(outdir, "report.md"), "w").write(text)
    open(os.path.join(outdir, "results.txt"), "w").write("\n".join(lines) + "\n")
    sys.stdout.write(text)
    # A measurement must have moved what its trace asks.
    bad = [k for k, v in rows.items() for m in v if m["expected"] and abs(m["bytes"] / m["expected"] - 1) > 0.01]
    if bad:
        sys.stderr.write("transports: bytes moved differ from the trace's by more than 1%%: %s\n" % bad)
        return 1
    missing = [(wl, j, d) for wl, j in wls for d in devs if (wl, j, d) not in med]
    if missing:
        sys.stderr.write("transports: measurements missing: %s\n" % missing)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
