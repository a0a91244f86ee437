#!/usr/bin/env bash
# Alternating rounds of single fio cells against gzramd and nbdkit's memory
# plugin: the per-round IOPS ratio of cells that move by ±15 % from one
# full `make bench-e2e` to the next on a shared machine.
#
# Usage: bench/ab.sh ROUNDS SECONDS CELL...   CELL = rw:iodepth:jobs,
#        e.g. bench/ab.sh 9 5 randwrite:32:1 randwrite:32:4
# Each round starts each server afresh, fills 512 MiB with 1 MiB writes,
# then runs every cell (4 KiB blocks, 50 % compressible data, 1 s ramp).
# Environment: GZRAMD (default bin/gzramd), GZRAMD_ARGS (more serve flags).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
ROUNDS=$1 RUNTIME=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GZRAMD=${GZRAMD:-$ROOT/bin/gzramd}
[ -x "$GZRAMD" ] || { echo "$GZRAMD not built (make build)" >&2; exit 1; }
W=$(mktemp -d /tmp/gzramd-ab.XXXXXX)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"' EXIT
fioargs=(--ioengine=nbd --buffer_compress_percentage=50 --buffer_compress_chunk=4096)

start() {
	rm -f "$W/s.sock"
	if [ "$1" = nbdkit ]; then
		nbdkit -f -U "$W/s.sock" memory 1024M >"$W/$1.log" 2>&1 &
	else
		# shellcheck disable=SC2086
		"$GZRAMD" serve --size 1024MiB --socket "$W/s.sock" --export gzram0 --metrics "" ${GZRAMD_ARGS:-} >"$W/$1.log" 2>&1 &
	fi
	PID=$!
	for _ in $(seq 100); do [ -S "$W/s.sock" ] && return 0; sleep 0.1; done
	echo "$1 did not come up" >&2
	cat "$W/$1.log" >&2
	exit 1
}

for r in $(seq "$ROUNDS"); do
	for s in gzramd nbdkit; do
		start "$s"
		exp=gzram0
		[ "$s" = nbdkit ] && exp=
		uri="nbd+unix:///$exp?socket=$W/s.sock"
		fio --name=fill "${fioargs[@]}" --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=512M >/dev/null
		for cell in "$@"; do
			IFS=: read -r rw qd jobs <<<"$cell"
			fio --name=cell "${fioargs[@]}" --uri="$uri" --rw="$rw" --bs=4k --iodepth="$qd" --numjobs="$jobs" --group_reporting \
				--size=512M --time_based --runtime="$RUNTIME" --ramp_time=1 \
				--output-format=json --output="$W/f.json" >/dev/null
			iops=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(int(j["write"]["iops"]+j["read"]["iops"]))' "$W/f.json")
			echo "$r $s $cell $iops" | tee -a "$W/rounds.txt"
		done
		kill "$PID"
		wait "$PID" 2>/dev/null || true
		PID=
	done
done
python3 - "$W/rounds.txt" <<'PY'
import collections, statistics, sys
iops = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, server, cell, n = line.split()
    iops[(cell, r)][server] = int(n)
ratios = collections.defaultdict(list)
for (cell, _), v in sorted(iops.items()):
    if len(v) == 2:
        ratios[cell].append(v["gzramd"] / v["nbdkit"])
for cell, rs in ratios.items():
    print(f"{cell}: gzramd/nbdkit median {statistics.median(rs):.3f} (rounds: {' '.join(f'{x:.2f}' for x in rs)})")
PY
