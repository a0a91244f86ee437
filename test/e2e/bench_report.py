#!/usr/bin/env python3
"""Turns bench/e2e.sh's fio JSON, CPU and memory samples into a markdown
table and a PNG: each figure for gzramd and nbdkit's memory plugin, and
their ratio (gzramd/nbdkit, measured in the same run)."""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess

SERVERS = ("gzramd", "nbdkit")


def fio_result(path):
    with open(path) as f:
        doc = json.load(f)
    job = doc["jobs"][0]
    rw = job["job options"].get("rw", "")
    side = job["read"] if "read" in rw else job["write"]
    pct = side["clat_ns"].get("percentile", {})
    return {
        "iops": side["iops"],
        "bw": side["bw_bytes"],
        "bytes": side["io_bytes"],
        "p50": pct.get("50.000000", 0) / 1e3,
        "p99": pct.get("99.000000", 0) / 1e3,
    }


def load(work):
    res = {s: {} for s in SERVERS}
    order = []  # as the jobs ran
    with open(os.path.join(work, "cpu.txt")) as f:
        for line in f:
            server, name, t0, t1, tck, runtime, ramp = line.split()
            res[server][name] = fio_result(os.path.join(work, f"{server}.{name}.json"))
            if name not in order:
                order.append(name)
            secs = (int(t1) - int(t0)) / int(tck)
            # fio counts bytes only after the ramp; the CPU sample spans both.
            secs *= int(runtime) / (int(runtime) + int(ramp))
            r = res[server][name]
            r["cpu_per_gb"] = secs / (r["bytes"] / 1e9) if r["bytes"] else float("nan")
    rss = {}
    path = os.path.join(work, "rss.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                server, before, after, size = line.split()
                rss[server] = (int(before) * 1024, int(after) * 1024, int(size))
    metrics = {}
    path = os.path.join(work, "gzramd.corpus.metrics")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = re.match(r"^(gzramd_[a-z_]+) ([0-9.e+-]+)$", line.strip())
                if m:
                    metrics[m.group(1)] = float(m.group(2))
    return res, order, rss, metrics


def machine():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return (f"{os.cpu_count()} CPUs ({model}), {mem}, kernel {platform.release()}"
            + (f", GPU {gpu}" if gpu else ", no GPU"))


def version(work):
    try:
        with open(os.path.join(work, "version")) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def ratio(a, b):
    return f"{a / b:.2f}" if b else "n/a"


def report(args):
    res, order, rss, metrics = load(args.work)
    g, n = res["gzramd"], res["nbdkit"]
    lines = [
        f"# End-to-end benchmark: gzramd ({args.backend}) vs nbdkit memory",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}",
        f"- Command: `{args.command}`, gzramd version {version(args.work)}",
        "- fio `ioengine=nbd` over a Unix socket, one NBD connection per fio job, "
        "data 50 % compressible (`buffer_compress_percentage=50`), 512 MiB region of a 1 GiB device; "
        "the 1 MiB sequential write fills the region the reads then read.",
        "- CPU-s/GB: the server process's utime+stime (/proc/PID/stat) over the bytes fio moved. "
        "Ratios are gzramd/nbdkit from the same run (>1 IOPS = gzramd faster; <1 latency, CPU = gzramd better).",
        "",
        "| job | gzramd IOPS | nbdkit IOPS | IOPS ratio | gzramd MB/s | nbdkit MB/s "
        "| gzramd p50/p99 µs | nbdkit p50/p99 µs | p99 ratio | gzramd CPU-s/GB | nbdkit CPU-s/GB | CPU ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in order:
        a, b = g.get(name), n.get(name)
        if not a or not b:
            continue
        lines.append(
            f"| {name} | {a['iops']:.0f} | {b['iops']:.0f} | {ratio(a['iops'], b['iops'])} "
            f"| {a['bw'] / 1e6:.1f} | {b['bw'] / 1e6:.1f} "
            f"| {a['p50']:.1f} / {a['p99']:.1f} | {b['p50']:.1f} / {b['p99']:.1f} | {ratio(a['p99'], b['p99'])} "
            f"| {a['cpu_per_gb']:.2f} | {b['cpu_per_gb']:.2f} | {ratio(a['cpu_per_gb'], b['cpu_per_gb'])} |")
    if rss:
        lines += ["", "## Memory after writing the shared corpus (nbdcopy, read back and compared)", "",
                  "| server | corpus | RSS before | RSS after | RSS growth / corpus |",
                  "|---|---:|---:|---:|---:|"]
        for server in SERVERS:
            if server in rss:
                before, after, size = rss[server]
                lines.append(f"| {server} | {size / 2**20:.1f} MiB | {before / 2**20:.1f} MiB "
                             f"| {after / 2**20:.1f} MiB | {(after - before) / size:.3f} |")
        if "gzramd" in rss and "nbdkit" in rss:
            lines.append("")
            lines.append(f"gzramd/nbdkit resident memory after the corpus: "
                         f"{ratio(rss['gzramd'][1], rss['nbdkit'][1])}.")
        if metrics.get("gzramd_orig_data_bytes"):
            o, c = metrics["gzramd_orig_data_bytes"], metrics.get("gzramd_compr_data_bytes", 0)
            u = metrics.get("gzramd_mem_used_bytes", 0)
            lines.append(f"gzramd's metrics: orig_data {o / 2**20:.1f} MiB, compr_data {c / 2**20:.1f} MiB "
                         f"(ratio {ratio(o, c)}), mem_used {u / 2**20:.1f} MiB.")
    with open(args.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(args, res, order)


def plot(args, res, order):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_report: no matplotlib (python3-matplotlib): no plot")
        return
    names = [o for o in order if o in res["gzramd"] and o in res["nbdkit"]]
    x = range(len(names))
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    for ax, key, title, scale in (
            (axes[0], "iops", "IOPS (log)", 1),
            (axes[1], "p99", "p99 completion latency, µs (log)", 1),
            (axes[2], "cpu_per_gb", "server CPU-seconds per GB", 1)):
        for i, server in enumerate(("gzramd", "nbdkit")):
            vals = [res[server][nm][key] * scale for nm in names]
            ax.bar([p + (i - 0.5) * 0.4 for p in x], vals, 0.4,
                   label=f"gzramd ({args.backend})" if server == "gzramd" else "nbdkit memory")
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_title(title)
        if key != "cpu_per_gb":
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"fio nbd engine, unix socket — {machine()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=90)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--png", required=True)
    p.add_argument("--command", required=True)
    report(p.parse_args())


if __name__ == "__main__":
    main()
