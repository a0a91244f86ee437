#!/usr/bin/env python3
"""Checks that gzramd's metrics, scraped by the e2e guest, show the traffic.

Input lines: "<when> <series> <value>", when being "peak" (scraped while the
hog's pages sat in swap) or "end" (after the swap was turned off). Exits 1
naming every check that failed or could not be made.

With a second argument "ublk" the kernel device was served through ublk,
whose requests pass no NBD counter: the end's gzramd_transport_info must say
ublk, and gzramd_ublk_requests_total must count writes, reads and discards.
"""
import re
import sys

SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?$')


def load(path):
    snaps = {"peak": {}, "end": {}}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3 or parts[0] not in snaps:
                continue
            try:
                snaps[parts[0]][parts[1]] = float(parts[2])
            except ValueError:
                continue
    return snaps


def gauge(snap, name):
    return snap.get(name)


def trims(snap):
    """Trim requests received: gzramd_nbd_requests_total{command="trim"},
    or failing that any trim/discard counter, however it is labelled."""
    exact = snap.get('gzramd_nbd_requests_total{command="trim"}')
    if exact is not None:
        return exact
    total, seen = 0.0, False
    for series, value in snap.items():
        m = SERIES.match(series)
        if not m:
            continue
        name, labels = m.group(1), (m.group(3) or "").lower()
        if not name.endswith("_total") or "bytes" in name:
            continue
        if "trim" in name or "discard" in name or '"trim"' in labels or '"discard"' in labels:
            total += value
            seen = True
    return total if seen else None


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["ublk"]):
        sys.exit("usage: metrics.py FILE [ublk]")
    ublk = sys.argv[2:] == ["ublk"]
    snaps = load(sys.argv[1])
    peak, end = snaps["peak"], snaps["end"]
    problems = []
    orig = gauge(peak, "gzramd_orig_data_bytes")
    compr = gauge(peak, "gzramd_compr_data_bytes")
    if not peak:
        problems.append("no metrics were scraped at the hog's peak")
    elif orig is None or compr is None:
        problems.append("gzramd_orig_data_bytes / gzramd_compr_data_bytes missing at the peak")
    else:
        print(f"metrics: at the peak orig_data {orig / 2**20:.1f} MiB, "
              f"compr_data {compr / 2**20:.1f} MiB (ratio {orig / compr if compr else float('inf'):.2f})")
        stored = gauge(peak, "gzramd_stored_pages")
        if stored is not None:
            print(f"metrics: {stored:.0f} pages stored at the peak")
        if orig <= 0 or (stored is not None and stored <= 0):
            problems.append(f"no pages stored at the peak (gzramd_orig_data_bytes={orig:.0f}, "
                            f"gzramd_stored_pages={stored})")
        elif compr >= orig:
            problems.append(f"compressed bytes {compr:.0f} not below the original {orig:.0f}")
    t = trims(end) if end else None
    if not end:
        problems.append("no metrics were scraped at the end")
    elif ublk:
        if end.get('gzramd_transport_info{transport="ublk"}') != 1:
            problems.append('no gzramd_transport_info{transport="ublk"} 1 at the end')
        w = end.get('gzramd_ublk_requests_total{command="write"}')
        r = end.get('gzramd_ublk_requests_total{command="read"}')
        d = end.get('gzramd_ublk_requests_total{command="discard"}')
        print(f"metrics: transport ublk: {d} discards (writes {w}, reads {r})")
        if not w or not r:
            problems.append("the ublk device's writes and reads were not counted (gzramd_ublk_requests_total)")
        if not d:
            problems.append("no discards received over ublk although swap was on with discard")
    elif t is None:
        problems.append("no trim/discard counter among the metrics")
    else:
        w = end.get('gzramd_nbd_requests_total{command="write"}')
        r = end.get('gzramd_nbd_requests_total{command="read"}')
        print(f"metrics: {t:.0f} trims received (writes {w}, reads {r})")
        if t <= 0:
            problems.append("no trims received although swap was on with discard")
    for p in problems:
        print(f"metrics: FAIL: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
