#!/usr/bin/env bash
# Replays a trace of NBD requests (a fio iolog, version 2, as written by
# `gzramd serve --record-trace`) with fio, in one run, against gzramd
# --backend cpu, gzramd --backend gpu (where a GPU is usable; else a line
# says why not), kernel zram (/dev/zram0, lz4, libaio with O_DIRECT; as
# root) and nbdkit's memory plugin; gzramd and nbdkit through fio's nbd
# engine on a Unix socket (bench/lib.sh starts and stops each target).
# Each job replays the whole trace at iodepth 32 as fast as it can
# (replay_no_stall), with bench/e2e.sh's data (half compressible), each
# run on a fresh device. For each target and job count: MB/s, latency, and
# the whole machine's CPU-seconds per GB moved: user+nice+system+irq+
# softirq+steal of /proc/stat over the fio run (not idle, not iowait), per
# 10^9 bytes read and written. Everything else on the machine counts too:
# run it on a quiet one.
#
# Usage: bench/trace.sh [TRACE]
#   TRACE defaults to bench/traces/host-2.iolog.zst (bench/traces/README.md);
#   .zst and .xz files are decompressed to a temporary file first.
#
# Environment:
#   TRACE_OUT       also write the report (markdown) to this file
#   TRACE_TARGETS   default "gzramd-cpu gzramd-gpu zram nbdkit" (bench/lib.sh
#                   names the others: gzramd-gpu-zstd, zram-zstd, ...)
#   TRACE_JOBS      fio job counts (default "1 4")
#   TRACE_IODEPTH   fio iodepth (default 32)
#   TRACE_REPEAT    each job replays the trace this many times over
#                   (default 10: runs long enough to measure; the host-2
#                   trace then moves 6.4 GB a job)
#   TRACE_ROUNDS    rounds of every target (default 1); the report gives
#                   medians, and ratios taken within each round
#   TRACE_PAIRS     the ratios to report, A/B each (default
#                   "gzramd-gpu/gzramd-cpu gzramd-gpu/zram gzramd-cpu/zram")
#   TRACE_TLS       1: TLS against plain TCP instead, both on loopback, the
#                   targets "gzramd-cpu@tcp gzramd-cpu@tls" and the pair
#                   gzramd-cpu@tls/gzramd-cpu@tcp unless TRACE_TARGETS and
#                   TRACE_PAIRS say otherwise (bench/lib.sh: a target's @tcp
#                   or @tls; throwaway certificates made with openssl)
#   TRACE_THREADS   1: also the busiest threads of each run, by
#                   bench/threads.py (whose thread sets the pace: a
#                   client's at 100 % while the server's are not)
#   GZRAMD, GZRAMD_ARGS, E2E_NBDKIT_MEMORY: as for bench/lib.sh
# Tools come from PATH: fio (with its nbd engine), nbdkit, python3, and
# zstd or xz for a compressed trace; on a machine without packages, from
# the bundle test/e2e/gpu-bundle.sh makes (its header says how).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"

TRACE=${1:-$ROOT/bench/traces/host-2.iolog.zst}
TARGETS=${TRACE_TARGETS:-gzramd-cpu gzramd-gpu zram nbdkit}
PAIRS=${TRACE_PAIRS:-gzramd-gpu/gzramd-cpu gzramd-gpu/zram gzramd-cpu/zram}
if [ "${TRACE_TLS:-0}" = 1 ]; then
	TARGETS=${TRACE_TARGETS:-gzramd-cpu@tcp gzramd-cpu@tls}
	PAIRS=${TRACE_PAIRS:-gzramd-cpu@tls/gzramd-cpu@tcp}
fi
JOBS=${TRACE_JOBS:-1 4}
IODEPTH=${TRACE_IODEPTH:-32}
REPEAT=${TRACE_REPEAT:-10}
ROUNDS=${TRACE_ROUNDS:-1}

bench_require fio python3
[ -r "$TRACE" ] || bench_die "no trace at $TRACE"
bench_workdir
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

case "$TRACE" in
*.zst)
	bench_require zstd
	zstd -q -d -c "$TRACE" >"$WORK/trace.iolog"
	;;
*.xz)
	bench_require xz
	xz -d -c "$TRACE" >"$WORK/trace.iolog"
	;;
*) cp "$TRACE" "$WORK/trace.iolog" ;;
esac
head -1 "$WORK/trace.iolog" | grep -q '^fio version 2 iolog' || bench_die "$TRACE is not a fio iolog, version 2"

# The trace's statistics, and the extent of its requests.
STATS=$(awk '
	NF == 4 && $1 != "fio" {
		n[$2]++; b[$2] += $4
		if ($2 == "write" && $4 == 131072) w128++
		if ($2 != "sync" && $3 + $4 > end) end = $3 + $4
		if (($2 == "read" || $2 == "write") && $4 > maxrw) maxrw = $4
	}
	END {
		printf "reads=%.0f writes=%.0f trims=%.0f syncs=%.0f ", n["read"], n["write"], n["trim"], n["sync"]
		printf "read_bytes=%.0f write_bytes=%.0f writes_128k=%.0f end=%.0f maxrw=%.0f\n", b["read"], b["write"], w128, end, maxrw
	}' "$WORK/trace.iolog")
tstat() { echo "$STATS" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }
kib() { awk -v b="$(tstat "$1")" -v n="$(tstat "$2")" 'BEGIN { printf "%.1f", n ? b / n / 1024 : 0 }'; }
[ "$(tstat reads)" -gt 0 ] || [ "$(tstat writes)" -gt 0 ] || bench_die "$TRACE holds no reads or writes"
# Every target the size of the trace's extent, in whole MiB, at least 64.
BENCH_SIZE=$(awk -v e="$(tstat end)" 'BEGIN { m = int((e + 1048575) / 1048576); printf "%.0fM\n", m < 64 ? 64 : m }')

# fio's copy of the trace. fio replays an iolog's trims from version 3.34
# on, and sizes every I/O buffer for the largest request of any kind:
# longer trims (swapon's discard of the whole device) are cut into pieces
# no longer than the largest read or write. Older fio skips each trim
# with "bad ddir: 2": they are left out of its copy, and the report says
# so.
FIO_VERSION=$(fio --version)
if awk -v v="${FIO_VERSION#fio-}" 'BEGIN { split(v, a, "."); exit !(a[1] > 3 || a[1] == 3 && a[2] + 0 >= 34) }'; then
	TRIMS="replayed"
else
	TRIMS="left out (fio before 3.34 replays none)"
fi
# And fio stops reaping completions once the log is empty: the requests
# still in flight go uncounted, its nbd engine may never send them, and
# nbdkit 1.32 aborts when a connection closes under its replies. So each
# job stops to reap everything (thinktime, counted in I/Os issued) once it
# has issued the trace's last read, write or trim; syncs after that one
# are left out.
awk -v trims="${TRIMS%% *}" -v chunk="$(tstat maxrw)" -v repeat="$REPEAT" -v count="$WORK/replay.ios" '
	NR == 1 || NF == 2 && $2 != "close" { head = head $0 "\n"; next }
	NF == 2 { tail = tail $0 "\n"; next }
	NF == 4 && $2 == "trim" {
		if (trims != "replayed") next
		for (off = $3; off < $3 + $4; off += chunk) {
			len = $3 + $4 - off; if (len > chunk) len = chunk
			body[++n] = sprintf("%s trim %.0f %.0f", $1, off, len)
			last = n; rw++
		}
		next
	}
	{ body[++n] = $0 }
	$2 == "read" || $2 == "write" { last = n; rw++ }
	END {
		printf "%s", head
		for (r = 1; r <= repeat; r++) for (i = 1; i <= (r < repeat ? n : last); i++) print body[i]
		printf "%s", tail
		printf "%.0f\n", rw * repeat > count
	}' "$WORK/trace.iolog" >"$WORK/replay.iolog"
REPLAY_IOS=$(cat "$WORK/replay.ios")

: >"$WORK/rows"
for round in $(seq "$ROUNDS"); do
	# shellcheck disable=SC2086 # TARGETS is a list
	for target in $(bench_order "$round" $TARGETS); do
		for jobs in $JOBS; do
			# A fresh device for each run, as the trace started on one.
			if ! target_start "$target"; then
				[ "$round" != 1 ] || echo "$target: skipped: $BENCH_WHY" | tee -a "$WORK/skipped.txt" >&2
				break
			fi
			# The nbd engine ignores file names (and fio 3.33 crashes on
			# replay_redirect there with more than one job); zram's I/O
			# must go to the device, not to a file named after the
			# trace's.
			redirect=()
			case "$target" in zram | zram-*) redirect=(--replay_redirect=/dev/zram0) ;; esac
			watch=""
			if [ "${TRACE_THREADS:-0}" = 1 ]; then
				python3 "$ROOT/bench/threads.py" watch "$WORK/threads.now" &
				watch=$!
			fi
			t0=$(machine_cpu_ticks) p0=0
			[ -z "$BENCH_METRICS" ] || p0=$(gzramd_metric process_cpu_seconds_total)
			target_fio "$target" replay --read_iolog="$WORK/replay.iolog" --replay_no_stall=1 "${redirect[@]}" \
				--iodepth="$IODEPTH" --numjobs="$jobs" \
				--thinktime=1 --thinktime_blocks="$REPLAY_IOS" --thinktime_blocks_type=issue \
				--output-format=json --output="$WORK/$target.$jobs.json" >/dev/null
			t1=$(machine_cpu_ticks) p1=0
			[ -z "$BENCH_METRICS" ] || p1=$(gzramd_metric process_cpu_seconds_total)
			# MB/s IOPS CPU-s/GB p50 p99, after the target, job count and
			# round, and gzramd's own CPU-s/GB (its serving process's
			# process_cpu_seconds_total; 0 for the others).
			echo "$(fio_summary "$WORK/$target.$jobs.json" "$t0" "$t1" 1 1) $(fio_process_cpu "$WORK/$target.$jobs.json" "$p0" "$p1")" |
				sed "s/^/$target $jobs $round /" >>"$WORK/rows"
			bench_log "$(tail -1 "$WORK/rows")"
			if [ -n "$watch" ]; then
				kill -TERM "$watch" && wait "$watch" || true
				{ echo "$target, $jobs jobs, round $round: $(cat "$WORK/threads.now")"; echo; } >>"$WORK/threads"
			fi
			case "$target" in
			gzramd-*@tls)
				# What the client and gzramd agreed on, for the report.
				grep -ho 'tls="[^"]*" cipher=[A-Z0-9_]*' "$WORK/$target.log" | sort -u | sed "s/^/$target: /" >>"$WORK/ciphers"
				;;
			esac
			case "$target" in
			gzramd-*)
				echo "$target $jobs $(gzramd_metric gzramd_compressed_pages_total 'backend="gpu"') $(gzramd_metric gzramd_compressed_pages_total 'backend="cpu"')" >>"$WORK/pages"
				;;
			esac
			target_stop "$target"
		done
	done
done
bench_medians 2 "$WORK/rows" >"$WORK/medians"
# The GPU's share of the pages compressed, over all rounds.
[ -s "$WORK/pages" ] && awk '{ g[$1" "$2] += $3; c[$1" "$2] += $4 } END { for (k in g) printf "%s %.1f\n", k, g[k] + c[k] ? 100 * g[k] / (g[k] + c[k]) : 0 }' "$WORK/pages" >"$WORK/shares"
: >>"$WORK/shares"
awk '{ $1 = "jobs-" $2 " " $1; $2 = ""; print }' "$WORK/rows" >"$WORK/cases"

{
	echo "# Trace replay: $(basename "$TRACE")"
	echo
	echo "Trace: $(tstat reads) reads (mean $(kib read_bytes reads) KiB), $(tstat writes) writes (mean $(kib write_bytes writes) KiB, $(awk -v a="$(tstat writes_128k)" -v n="$(tstat writes)" 'BEGIN { printf "%.0f", n ? 100 * a / n : 0 }') % of them 128 KiB), $(tstat trims) trims, flushes: $(tstat syncs); replayed $REPEAT times over by each job: $(awk -v b="$(($(tstat read_bytes) + $(tstat write_bytes)))" -v r="$REPEAT" 'BEGIN { printf "%.2f", b * r / 1e9 }') GB a job; trims $TRIMS; devices of $BENCH_SIZE."
	echo "$FIO_VERSION: read_iolog, replay_no_stall=1, iodepth=$IODEPTH, buffer_compress_percentage=50, buffer_compress_chunk=4096; nbd engine over a Unix socket (over loopback TCP for a target's @tcp, with TLS for @tls), zram with libaio and O_DIRECT."
	[ ! -s "$WORK/ciphers" ] || echo "TLS: $(sort -u "$WORK/ciphers" | paste -sd ';' | sed 's/;/; /g')."
	echo "CPU-s/GB: the whole machine's user+nice+system+irq+softirq+steal (/proc/stat) over the fio run, per 10^9 bytes read and written (gzramd's: its serving process's process_cpu_seconds_total; the rest is fio's, its clients' and the kernel's beyond it); load average before the run $LOAD. Latency: completion latency of the reads."
	echo
	echo "| target | jobs | MB/s | CPU-s per GB | of which gzramd's | p50 µs | p99 µs | pages on the GPU |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	awk 'NR == FNR { share[$1" "$2] = $3; next }
		{ k = $1" "$2; printf "| %s | %d | %.0f | %.2f | %s | %.0f | %.0f | %s |\n", $1, $2, $4, $6, $1 ~ /^gzramd-/ ? sprintf("%.2f", $9) : "-", $7, $8, k in share ? share[k] "%" : "-" }' "$WORK/shares" "$WORK/medians"
	[ "$ROUNDS" = 1 ] || { echo; echo "Each figure is the median of $ROUNDS rounds; every other round ran the targets in the reverse order."; }
	echo
	echo "Ratios within a round (median over the rounds), throughput and CPU-s/GB:"
	echo
	bench_ratio_table "$WORK/cases" $PAIRS
	[ ! -s "$WORK/skipped.txt" ] || { echo; cat "$WORK/skipped.txt"; }
	if [ -s "$WORK/threads" ]; then
		echo
		echo "The busiest threads of each run (bench/threads.py):"
		echo
		echo '```'
		cat "$WORK/threads"
		echo '```'
	fi
	if [ "$ROUNDS" != 1 ]; then
		echo
		echo "Every round (target, jobs, round, MB/s, IOPS, CPU-s/GB, p50 µs, p99 µs, gzramd's CPU-s/GB):"
		echo
		echo '```'
		sort -k1,1 -k2n -k3n "$WORK/rows"
		echo '```'
	fi
	echo
	bench_machine
	echo "Command: ${TRACE_TLS:+TRACE_TLS=$TRACE_TLS }${TRACE_THREADS:+TRACE_THREADS=$TRACE_THREADS }TRACE_TARGETS=\"$TARGETS\" TRACE_ROUNDS=$ROUNDS TRACE_JOBS=\"$JOBS\" TRACE_IODEPTH=$IODEPTH TRACE_REPEAT=$REPEAT bench/trace.sh${1:+ $1}"
} | tee "${TRACE_OUT:-/dev/null}"
