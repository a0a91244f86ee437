#!/bin/bash
# The dense tier's trade (issue 24), measured through NBD: for each gzramd
# target, write a corpus of real memory pages (nbdcopy), read mem_used and
# time 4 KiB QD1 random reads from the fast tier; then leave the device
# idle until every group has aged into the dense tier (--dense-after) and
# the compactor has given the freed slabs back, and read mem_used and time
# 4 KiB QD1 random reads and 32 KiB QD1 reads (read-ahead) from the dense
# tier. Kernel zram targets get the same corpus (dd, O_DIRECT) and reads.
#
# The ratio is what zramctl shows: the whole corpus over mem_used_total.
# The recompression's CPU is the recompressor's own busy time
# (gzramd_dense_busy_seconds_total) per GB of pages recompressed; the
# serving process's CPU (process_cpu_seconds_total) over the aging (and
# the compaction after it), less what it spends idle (and scraped) at the
# rate of the 4 s before any group is idle (with AGING_AFTER of 6s or
# more); and the whole machine's (/proc/stat) over the aging.
#
# Environment (and bench/lib.sh's):
#   AGING_TARGETS  default "gzramd-cpu zram-lzo-rle"; gzramd targets get
#                  --dense-after $AGING_AFTER --dense-cpu 1 --prefault 0
#                  besides their flags: with prefaulting, the store keeps
#                  up to --prefault (16 MiB) of the slabs that aging
#                  empties resident for reuse, in mem_used (the
#                  store-prefault holding), which on a corpus of 96 MB
#                  would hide most of what aging saves
#   AGING_CORPUS   the corpus, zstd- or xz-compressed (.xz) (default
#                  ../shared/corpus/memory-pages.bin.zst)
#   AGING_COPIES   write the corpus this many times end to end (default 1):
#                  more to recompress, for steadier CPU figures
#   AGING_AFTER    --dense-after (default 2s)
#   AGING_RUNTIME  seconds per read measurement (default 8)
#   AGING_TRACE    a recorded trace (fio iolog, version 2; zstd) whose reads
#                  are replayed at QD1, 3 times over, before aging and after
#                  (each read moved onto the corpus): the kernel's own
#                  swap-in pattern, readahead windows at any page (default
#                  bench/traces/host-2.iolog.zst; empty: none)
#   AGING_OUT      also write the markdown table here
# Needs fio, nbdcopy and zstd; zram targets need root and /dev/zram0.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

TARGETS=${AGING_TARGETS:-gzramd-cpu zram-lzo-rle}
CORPUS=${AGING_CORPUS:-$BENCH_ROOT/../shared/corpus/memory-pages.bin.zst}
AFTER=${AGING_AFTER:-2s}
RUNTIME=${AGING_RUNTIME:-8}
bench_require fio nbdcopy zstd python3
[ -f "$CORPUS" ] || {
	echo "aging.sh: skipped: no corpus at $CORPUS (AGING_CORPUS)" >&2
	exit 0
}
bench_workdir
case "$CORPUS" in
*.xz) xz -dc "$CORPUS" >"$WORK/corpus" ;;
*) zstd -dqc "$CORPUS" >"$WORK/corpus" ;;
esac
if [ "${AGING_COPIES:-1}" -gt 1 ]; then
	mv "$WORK/corpus" "$WORK/corpus.1"
	for _ in $(seq "$AGING_COPIES"); do cat "$WORK/corpus.1"; done >"$WORK/corpus"
	rm "$WORK/corpus.1"
fi
BYTES=$(stat -c %s "$WORK/corpus")
# fio's region: the corpus, in whole 32 KiB reads.
REGION=$((BYTES / 32768 * 32768))
export GZRAMD_ARGS="${GZRAMD_ARGS:-} --dense-after $AFTER --dense-cpu 1 --prefault 0"
RESULTS=$WORK/results.txt
TRACE=${AGING_TRACE-$BENCH_ROOT/bench/traces/host-2.iolog.zst}
TRACE_ROWS=$WORK/trace-rows.txt
if [ -n "$TRACE" ]; then
	# The trace's reads, each moved onto the corpus (modulo, page-aligned,
	# within fio's region), 3 times over.
	zstd -dqc "$TRACE" | awk -v region="$REGION" '
		NR == 1 || NF == 2 && $2 != "close" { head = head $0 "\n"; if ($2 == "open") name = $1; next }
		NF == 4 && $2 == "read" && $4 <= 131072 {
			off = $3 % (region - 131072); off -= off % 4096
			body[++n] = $1 " read " off " " $4
		}
		END {
			printf "%s", head
			for (r = 1; r <= 3; r++) for (i = 1; i <= n; i++) print body[i]
			print name " close"
		}' >"$WORK/reads.iolog"
fi

# tracereads TARGET NAME: the trace's reads replayed at QD1; prints "MB/s
# mean-µs p50-µs p99-µs CPU-s/GB".
tracereads() {
	local target=$1 name=$2 t0 t1 redirect=()
	case "$target" in zram | zram-*) redirect=(--replay_redirect=/dev/zram0) ;; esac
	t0=$(machine_cpu_ticks)
	target_fio "$target" "$name" --read_iolog="$WORK/reads.iolog" --replay_no_stall=1 "${redirect[@]}" --iodepth=1 \
		--output-format=json --output="$WORK/$target.$name.json" >/dev/null
	t1=$(machine_cpu_ticks)
	python3 - "$WORK/$target.$name.json" "$t0" "$t1" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
clat = r["clat_ns"]
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / float(sys.argv[4])
print("%.1f %.1f %.1f %.1f %.3f" % (r["bw_bytes"] / 1e6, clat["mean"] / 1e3, clat["percentile"]["50.000000"] / 1e3,
      clat["percentile"]["99.000000"] / 1e3, cpu / (r["io_bytes"] / 1e9)))
EOF
}

# reads TARGET NAME BS: one QD1 random-read run over the corpus; prints
# fio_summary's "MB/s IOPS CPU-s/GB p50 p99".
reads() {
	local target=$1 name=$2 bs=$3 t0 t1
	t0=$(machine_cpu_ticks)
	target_fio "$target" "$name" --rw=randread --bs="$bs" --iodepth=1 --numjobs=1 --size="$REGION" \
		--time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$WORK/$target.$name.json" >/dev/null
	t1=$(machine_cpu_ticks)
	fio_summary "$WORK/$target.$name.json" "$t0" "$t1" "$((RUNTIME + 1))" "$RUNTIME"
}

# settled: waits until the dense tier has stopped growing and mem_used
# has been steady for 12 s (the compactor checks every 10 s).
settled() {
	local last="" same=0 now
	for _ in $(seq 600); do
		now="$(gzramd_metric gzramd_tier_pages 'tier="dense"') $(gzramd_metric gzramd_mem_used_bytes)"
		if [ "$now" = "$last" ]; then
			same=$((same + 1))
			[ "$same" -lt 12 ] || return 0
		else
			same=0 last=$now
		fi
		sleep 1
	done
	bench_log "the dense tier did not settle in 10 minutes"
}

bench_log "corpus: $BYTES bytes"
for target in $TARGETS; do
	if ! target_start "$target"; then
		echo "$target: skipped: $BENCH_WHY" | tee -a "$WORK/skipped.txt"
		continue
	fi
	case "$target" in
	zram | zram-*)
		dd if="$WORK/corpus" of=/dev/zram0 bs=1M oflag=direct status=none
		used=$(awk '{ print $3 }' /sys/block/zram0/mm_stat)
		fast=$(reads "$target" read4k 4k)
		read32=$(reads "$target" read32k 32k)
		echo "$target $(python3 -c "print('%.3f' % ($BYTES / $used))") $fast - - - - - - $read32 - - - - - -" >>"$RESULTS"
		[ -z "$TRACE" ] || echo "$target $(tracereads "$target" trace) - - - - - -" >>"$TRACE_ROWS"
		;;
	*)
		nbdcopy --synchronous "$WORK/corpus" "nbd+unix:///$BENCH_EXPORT?socket=$WORK/${target//+/_}.sock"
		used=$(gzramd_metric gzramd_mem_used_bytes)
		fast=$(reads "$target" fast4k 4k)
		fast32=$(reads "$target" fast32k 32k)
		tfast=""
		[ -z "$TRACE" ] || tfast=$(tracereads "$target" tracefast)
		bench_log "$target: written, mem_used $used; aging"
		t0=$(machine_cpu_ticks) s0=$(date +%s.%N) p0=$(gzramd_metric process_cpu_seconds_total)
		# The serving process's idle CPU, before any group is idle, where
		# --dense-after leaves the time (6 s or more), scraped as often as
		# settled scrapes it (a scrape reads the GPU's telemetry too).
		idle=-
		if [ "${AFTER%s}" -ge 6 ]; then
			for _ in 1 2 3 4; do
				gzramd_metric gzramd_tier_pages 'tier="dense"' >/dev/null
				gzramd_metric gzramd_mem_used_bytes >/dev/null
				sleep 1
			done
			idle=$(python3 -c "print(($(gzramd_metric process_cpu_seconds_total) - $p0) / ($(date +%s.%N) - $s0))")
			sleep $((${AFTER%s} - 4))
		else
			sleep "${AFTER%s}"
		fi
		settled
		t1=$(machine_cpu_ticks) s1=$(date +%s.%N) p1=$(gzramd_metric process_cpu_seconds_total)
		aged=$(gzramd_metric gzramd_mem_used_bytes)
		dense=$(gzramd_metric gzramd_tier_pages 'tier="dense"')
		stored=$(gzramd_metric gzramd_stored_pages)
		pages=$(gzramd_metric gzramd_dense_recompressed_pages_total)
		busy=$(gzramd_metric gzramd_dense_busy_seconds_total)
		denseread=$(reads "$target" dense4k 4k)
		read32=$(reads "$target" dense32k 32k)
		if [ -n "$TRACE" ]; then
			c0=$(gzramd_metric gzramd_dense_frame_reads_total 'from="cache"') d0=$(gzramd_metric gzramd_dense_frame_reads_total 'from="decoded"')
			tdense=$(tracereads "$target" tracedense)
			c1=$(gzramd_metric gzramd_dense_frame_reads_total 'from="cache"') d1=$(gzramd_metric gzramd_dense_frame_reads_total 'from="decoded"')
			echo "$target $tfast $tdense $(python3 -c "c, d = $c1 - $c0, $d1 - $d0; print('%.1f' % (100 * c / (c + d)) if c + d else '-')")" >>"$TRACE_ROWS"
		fi
		python3 - "$target" "$BYTES" "$used" "$aged" "$dense" "$stored" "$pages" "$busy" "$t0" "$t1" "$(getconf CLK_TCK)" "$fast" "$denseread" "$read32" \
			"$s0" "$s1" "$p0" "$p1" "$idle" "$fast32" >>"$RESULTS" <<'EOF'
import sys
t, total, used, aged, dense, stored, pages, busy, t0, t1, tck = sys.argv[1:12]
fast, dense_read, read32 = sys.argv[12].split(), sys.argv[13].split(), sys.argv[14].split()
s0, s1, p0, p1 = map(float, sys.argv[15:19])
gb = float(pages) * 4096 / 1e9
own = float(busy) / gb if gb else 0
machine = (int(t1) - int(t0)) / float(tck) / gb if gb else 0
process = "-"
if gb and sys.argv[19] != "-":
    process = "%.2f" % (((p1 - p0) - float(sys.argv[19]) * (s1 - s0)) / gb)
print(t, "%.3f" % (int(total) / float(used)), " ".join(fast), "%.3f" % (int(total) / float(aged)), " ".join(dense_read),
      " ".join(read32), "%.1f" % (100 * float(dense) / float(stored) if float(stored) else 0), "%.2f" % own, process, "%.2f" % machine,
      sys.argv[20].split()[0], sys.argv[20].split()[2])
EOF
		;;
	esac
	target_stop "$target"
	bench_log "$target: done"
done

{
	bench_machine
	echo
	echo "Corpus: $(basename "$CORPUS") (${AGING_COPIES:-1} times), $BYTES bytes; gzramd with --dense-after $AFTER --dense-cpu 1 --prefault 0; reads QD1 over the corpus, ${RUNTIME} s each."
	echo
	echo "| target | ratio before | 4K QD1 p50/p99 µs before | 32K QD1 MB/s, CPU-s/GB before | ratio after aging | 4K QD1 p50/p99 µs after | 32K QD1 MB/s after | CPU-s/GB | dense % of stored | recompression CPU-s/GB (own / process / machine) |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	# target ratio MB/s IOPS CPU p50 p99 | ratio MB/s IOPS CPU p50 p99 | MB/s IOPS CPU p50 p99 | dense own process machine | fast 32K MB/s CPU
	while read -r t r0 _ _ _ p50 p99 r1 _ _ _ q50 q99 m32 _ c32 _ _ dp own proc mach f32 fc32; do
		if [ "$r1" = - ]; then
			echo "| $t | $r0 | $p50 / $p99 | $m32, $c32 | (no tier) | - | - | - | - | - |"
			continue
		fi
		echo "| $t | $r0 | $p50 / $p99 | $f32, $fc32 | $r1 | $q50 / $q99 | $m32 | $c32 | $dp | $own / $proc / $mach |"
	done <"$RESULTS"
	if [ -s "$TRACE_ROWS" ]; then
		echo
		echo "The kernel's swap-in reads: $(basename "$TRACE")'s reads replayed 3 times over at QD1 ($(grep -c ' read ' "$WORK/reads.iolog") reads), each moved onto the corpus; zram has no tiers (its row is under \"before\")."
		echo
		echo "| target | before: MB/s | mean / p50 / p99 µs | CPU-s/GB | after aging: MB/s | mean / p50 / p99 µs | CPU-s/GB | dense frames from the cache % |"
		echo "|---|---:|---:|---:|---:|---:|---:|---:|"
		while read -r t m0 a0 p0 q0 c0 m1 a1 p1 q1 c1 hit; do
			echo "| $t | $m0 | $a0 / $p0 / $q0 | $c0 | $m1 | $a1 / $p1 / $q1 | $c1 | ${hit:--} |"
		done <"$TRACE_ROWS"
	fi
	[ ! -s "$WORK/skipped.txt" ] || { echo; sed 's/^/- /' "$WORK/skipped.txt"; }
} | tee "${AGING_OUT:-/dev/null}"
