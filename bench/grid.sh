#!/usr/bin/env bash
# The fio grid of issue 13, in one run, against each gzramd backend, kernel
# zram and nbdkit's memory plugin: 4 KiB random reads and writes at queue
# depth 1 and 32 with 1 and 4 jobs, and 128 KiB random writes at depth 8
# with 4 jobs. For each cell and target: MB/s, IOPS, completion latency
# (p50, p99) and whole-machine CPU-seconds per GB moved, from /proc/stat:
# user+nice+system+irq+softirq+steal (not idle, not iowait) over the run,
# per 10^9 bytes read and written. Everything else on the machine counts
# too: run it on a quiet one.
#
# gzramd and nbdkit are reached with fio's nbd engine over a Unix socket;
# zram (/dev/zram0, lz4; needs root; reset before and after) with libaio
# and O_DIRECT. Data is fio's, half compressible, as bench/e2e.sh writes.
#
# Environment:
#   GRID_TARGETS   default "gzramd-cpu gzramd-gpu zram nbdkit" (bench/lib.sh
#                  names the others: gzramd-gpu-zstd, zram-zstd, ...); a target
#                  that cannot run here (no GPU, no zram, not root) is
#                  skipped with a line saying why
#   GRID_CELLS     names from the list below (default: the first nine)
#   GRID_RUNTIME   seconds per cell (default 10, after a 2 s ramp)
#   GRID_ROUNDS    rounds of every target and cell (default 1); the report
#                  gives medians, and ratios taken within each round
#   GRID_PAIRS     the ratios to report, A/B each (default
#                  "gzramd-gpu/gzramd-cpu gzramd-gpu/zram")
#   GRID_OUT       also write the markdown table here
#   GZRAMD         the daemon (default bin/gzramd); GZRAMD_ARGS more flags
#   E2E_NBDKIT_MEMORY  nbdkit's memory plugin: a name or a .so path
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"

RUNTIME=${GRID_RUNTIME:-10}
ROUNDS=${GRID_ROUNDS:-1}
PAIRS=${GRID_PAIRS:-gzramd-gpu/gzramd-cpu gzramd-gpu/zram}
TARGETS=${GRID_TARGETS:-gzramd-cpu gzramd-gpu zram nbdkit}
# name rw bs iodepth jobs
ALL_CELLS="randwrite-4k-qd1-j1 randwrite 4k 1 1
randwrite-4k-qd32-j1 randwrite 4k 32 1
randwrite-4k-qd1-j4 randwrite 4k 1 4
randwrite-4k-qd32-j4 randwrite 4k 32 4
randread-4k-qd1-j1 randread 4k 1 1
randread-4k-qd32-j1 randread 4k 32 1
randread-4k-qd1-j4 randread 4k 1 4
randread-4k-qd32-j4 randread 4k 32 4
randwrite-128k-qd8-j4 randwrite 128k 8 4
randwrite-128k-qd8-j1 randwrite 128k 8 1"
# The issue's nine; the rest run when named in GRID_CELLS.
CELLS=${GRID_CELLS:-$(echo "$ALL_CELLS" | head -9 | cut -d' ' -f1)}

bench_require fio
bench_workdir
RESULTS=$WORK/results.txt

for round in $(seq "$ROUNDS"); do
	# shellcheck disable=SC2086 # TARGETS is a list
	for target in $(bench_order "$round" $TARGETS); do
		if ! target_start "$target"; then
			[ "$round" != 1 ] || echo "$target: skipped: $BENCH_WHY" | tee -a "$WORK/skipped.txt"
			continue
		fi
		# The reads read what a sequential pass wrote.
		target_fio "$target" fill --rw=write --bs=1M --iodepth=8 --numjobs=1 --size="$BENCH_REGION" >/dev/null
		for cell in $CELLS; do
			set -- $(echo "$ALL_CELLS" | awk -v c="$cell" '$1 == c')
			[ $# = 5 ] || bench_die "unknown cell $cell"
			t0=$(machine_cpu_ticks)
			target_fio "$target" "$cell" --rw="$2" --bs="$3" --iodepth="$4" --numjobs="$5" \
				--size="$BENCH_REGION" --time_based --runtime="$RUNTIME" --ramp_time=2 \
				--output-format=json --output="$WORK/$target.$cell.json" >/dev/null
			t1=$(machine_cpu_ticks)
			fio_summary "$WORK/$target.$cell.json" "$t0" "$t1" "$((RUNTIME + 2))" "$RUNTIME" |
				sed "s/^/$cell $target $round /" >>"$RESULTS"
			bench_log "$target: $cell done (round $round of $ROUNDS)"
		done
		case "$target" in
		gzramd-*)
			echo "$target $(gzramd_metric gzramd_compressed_pages_total 'backend="gpu"') $(gzramd_metric gzramd_compressed_pages_total 'backend="cpu"') $(gzramd_metric gzramd_inline_pages_total) $(gzramd_metric gzramd_gpu_fallbacks_total)" >>"$WORK/pages.txt"
			;;
		esac
		target_stop "$target"
	done
done
bench_medians 2 "$RESULTS" >"$WORK/medians.txt"

{
	echo "| cell | target | MB/s | IOPS | CPU-s/GB | p50 µs | p99 µs |"
	echo "|---|---|---:|---:|---:|---:|---:|"
	awk '{ printf "| %s | %s | %.0f | %.0f | %.2f | %.0f | %.0f |\n", $1, $2, $4, $5, $6, $7, $8 }' "$WORK/medians.txt"
	[ "$ROUNDS" = 1 ] || { echo; echo "Each figure is the median of $ROUNDS rounds; every other round ran the targets in the reverse order."; }
	echo
	echo "Ratios within a round (median over the rounds), throughput and CPU-s/GB:"
	echo
	bench_ratio_table "$RESULTS" $PAIRS
	if [ -s "$WORK/pages.txt" ]; then
		echo
		echo "Where gzramd compressed the pages written (all cells):"
		echo
		echo "| target | on the GPU | on the CPU | of those, inline | GPU share | GPU fallbacks |"
		echo "|---|---:|---:|---:|---:|---:|"
		awk '{ g[$1] += $2; c[$1] += $3; i[$1] += $4; f[$1] += $5 } END { for (t in g) print t, g[t], c[t], i[t], f[t] }' "$WORK/pages.txt" | sort |
			awk '{ s = $2 + $3; printf "| %s | %.0f | %.0f | %.0f | %.1f%% | %.0f |\n", $1, $2, $3, $4, s ? 100 * $2 / s : 0, $5 }'
	fi
	[ ! -s "$WORK/skipped.txt" ] || { echo; cat "$WORK/skipped.txt"; }
	if [ "$ROUNDS" != 1 ]; then
		echo
		echo "Every round (cell, target, round, MB/s, IOPS, CPU-s/GB, p50 µs, p99 µs):"
		echo
		echo '```'
		sort -k1,1 -k2,2 -k3n "$RESULTS"
		echo '```'
	fi
	echo
	bench_machine
} | tee "${GRID_OUT:-/dev/null}"
