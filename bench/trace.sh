#!/usr/bin/env bash
# Replays a trace of NBD requests (a fio iolog, version 2, as written by
# `gzramd serve --record-trace`) with fio, in one run, against:
#   gzramd-cpu   gzramd --backend cpu, through fio's nbd engine (Unix socket)
#   gzramd-gpu   gzramd --backend gpu, where a GPU is usable (else a line says why not)
#   zram         the kernel's /dev/zram0 with lz4, libaio, direct=1 (as root, where zram exists)
#   nbdkit       nbdkit's memory plugin, through fio's nbd engine
# For each target and job count (each job replays the whole trace, at
# iodepth 32, as fast as it can: replay_no_stall) it prints MB/s and the
# whole machine's CPU-seconds per GB moved: user+nice+system+irq+softirq+steal
# from /proc/stat over the fio run (not idle, not iowait), per 1e9 bytes
# read and written. Every run starts on a fresh device.
#
# Usage: bench/trace.sh [TRACE]
#   TRACE defaults to bench/traces/host-2.iolog.zst (see bench/traces/README.md);
#   .zst and .xz files are decompressed to a temporary file first.
#
# Environment:
#   TRACE_OUT          also write the report (markdown) to this file
#   TRACE_TARGETS      targets to run (default "gzramd-cpu gzramd-gpu zram nbdkit")
#   TRACE_JOBS         fio job counts (default "1 4")
#   TRACE_IODEPTH      fio iodepth (default 32)
#   TRACE_REPEAT       replay the trace this many times over in each job
#                      (default 10: runs long enough to measure; the
#                      host-2 trace then moves 6.4 GB a job)
#   GZRAMD             the daemon binary (default bin/gzramd)
#   TRACE_GZRAMD_ARGS  more gzramd serve flags (split on spaces)
#   E2E_NBDKIT_MEMORY  nbdkit's memory plugin: a name or a .so path (default memory)
#   ZRAM_DEV           the zram device (default /dev/zram0): one not set
#                      up (disksize 0), which is set up for each run and
#                      reset after it
# fio (with its nbd engine), nbdkit, and zstd or xz for a compressed trace
# come from PATH: on a machine without packages, from the bundle that
# test/e2e/gpu-bundle.sh makes (its header says how).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

TRACE=${1:-$ROOT/bench/traces/host-2.iolog.zst}
TARGETS=${TRACE_TARGETS:-gzramd-cpu gzramd-gpu zram nbdkit}
JOBS=${TRACE_JOBS:-1 4}
IODEPTH=${TRACE_IODEPTH:-32}
REPEAT=${TRACE_REPEAT:-10}
GZRAMD=${GZRAMD:-$ROOT/bin/gzramd}
ZRAM_DEV=${ZRAM_DEV:-/dev/zram0}
EXPORT=gzram0
# The data fio writes, as bench/e2e.sh writes it: pages that compress
# about 2:1.
DATA=(--buffer_compress_percentage=50 --buffer_compress_chunk=4096)

log() { echo "trace: $*" >&2; }
die() {
	echo "trace: FAIL: $*" >&2
	exit 1
}

PIDS=()
ZRAM_SET=0
WORK=
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	[ "$ZRAM_SET" = 0 ] || zram_reset
	[ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v fio >/dev/null || die "fio missing (Debian package fio; or PATH from test/e2e/gpu-bundle.sh's bundle)"
[ -r "$TRACE" ] || die "no trace at $TRACE"
WORK=$(mktemp -d /tmp/gzramd-trace.XXXXXX)
TCK=$(getconf CLK_TCK)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

# The trace, decompressed.
case "$TRACE" in
*.zst) zstd -q -d -c "$TRACE" >"$WORK/trace.iolog" || die "zstd -d $TRACE" ;;
*.xz) xz -d -c "$TRACE" >"$WORK/trace.iolog" || die "xz -d $TRACE" ;;
*) cp "$TRACE" "$WORK/trace.iolog" ;;
esac
head -1 "$WORK/trace.iolog" | grep -q '^fio version 2 iolog' || die "$TRACE is not a fio iolog, version 2"

# Its statistics, and the device size that holds its every request.
STATS=$(awk '
	NF == 4 && $1 != "fio" {
		n[$2]++; b[$2] += $4
		if ($2 == "write" && $4 == 131072) w128++
		if ($2 != "sync" && $3 + $4 > end) end = $3 + $4
		if (($2 == "read" || $2 == "write") && $4 > maxrw) maxrw = $4
	}
	END {
		printf "reads=%.0f writes=%.0f trims=%.0f syncs=%.0f ", n["read"], n["write"], n["trim"], n["sync"]
		printf "read_bytes=%.0f write_bytes=%.0f trim_bytes=%.0f ", b["read"], b["write"], b["trim"]
		printf "writes_128k=%.0f end=%.0f maxrw=%.0f\n", w128, end, maxrw
	}' "$WORK/trace.iolog")
tstat() { echo "$STATS" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }
mean() { awk -v b="$(tstat "$1")" -v n="$(tstat "$2")" 'BEGIN { printf "%.1f", n ? b / n / 1024 : 0 }'; } # KiB
[ "$(tstat reads)" -gt 0 ] || [ "$(tstat writes)" -gt 0 ] || die "$TRACE holds no reads or writes"
# Device size: the trace's extent rounded up to a MiB, at least 64 MiB.
SIZE_MIB=$(awk -v e="$(tstat end)" 'BEGIN { m = int((e + 1048575) / 1048576); if (m < 64) m = 64; printf "%.0f\n", m }')

# fio's copy. fio replays an iolog's trims from version 3.34 on, and
# sizes every I/O buffer for the largest request of any kind: longer
# trims (swapon's discard of the whole device) are cut into pieces no
# longer than the largest read or write. Older fio skips each trim with
# "bad ddir: 2": they are left out of its copy, and the table says so.
FIO_VERSION=$(fio --version)
if awk -v v="${FIO_VERSION#fio-}" 'BEGIN { split(v, a, "."); exit !(a[1] > 3 || a[1] == 3 && a[2] + 0 >= 34) }'; then
	TRIMS="replayed"
else
	TRIMS="left out (fio before 3.34 replays none)"
fi
#
# And fio does not wait for the requests still in flight when the trace
# ends (it stops reaping once the log is empty): their bytes go
# uncounted, its nbd engine may never send them, and nbdkit 1.32 aborts
# when a connection closes under its replies. So each job stops to reap
# everything ("thinktime") once it has issued the trace's last read,
# write or trim; syncs after that one are left out.
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

cpu_busy() { awk '$1 == "cpu" { printf "%.0f\n", $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# gzramd_start BACKEND: sets PID and SOCK, or returns 1 with the reason
# in $GZLOG when the daemon refuses to start.
gzramd_start() {
	local backend=$1 i
	SOCK=$WORK/gzramd.sock
	GZLOG=$WORK/gzramd-$backend.log
	rm -f "$SOCK" "$GZLOG"
	"$GZRAMD" serve --size "${SIZE_MIB}MiB" --socket "$SOCK" --export "$EXPORT" \
		--metrics 127.0.0.1:0 --backend "$backend" ${TRACE_GZRAMD_ARGS:-} >"$GZLOG" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	for ((i = 0; i < 300; i++)); do
		if grep -qs 'msg="gzramd ready"' "$GZLOG"; then
			# The backend it runs on: --backend gpu either runs there or refuses.
			grep -q "msg=\"gzramd ready\".* backend=$backend" "$GZLOG" && return 0
			server_stop
			echo "it came up on another backend: $(grep 'msg="gzramd ready"' "$GZLOG")" >>"$GZLOG"
			return 1
		fi
		kill -0 "$PID" 2>/dev/null || {
			wait "$PID" 2>/dev/null || true
			return 1
		}
		sleep 0.1
	done
	die "gzramd --backend $backend not ready after 30 s: $(tail -3 "$GZLOG")"
}

nbdkit_start() {
	local i
	SOCK=$WORK/nbdkit.sock
	rm -f "$SOCK"
	nbdkit -f -U "$SOCK" "${E2E_NBDKIT_MEMORY:-memory}" "${SIZE_MIB}M" >"$WORK/nbdkit.log" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	for ((i = 0; i < 100; i++)); do
		[ -S "$SOCK" ] && return 0
		kill -0 "$PID" 2>/dev/null || break
		sleep 0.1
	done
	die "nbdkit did not come up: $(tail -3 "$WORK/nbdkit.log")"
}

server_stop() {
	kill "$PID" 2>/dev/null || true
	wait "$PID" 2>/dev/null || true
}

# zram_usable says why the zram device cannot be used, if it cannot.
zram_usable() {
	local name=${ZRAM_DEV#/dev/}
	[ "$(id -u)" = 0 ] || { echo "not root"; return 1; }
	[ -b "$ZRAM_DEV" ] || modprobe zram num_devices=1 2>/dev/null || true
	[ -b "$ZRAM_DEV" ] || { echo "no $ZRAM_DEV (no zram module?)"; return 1; }
	grep -q "^$ZRAM_DEV " /proc/swaps && { echo "$ZRAM_DEV is swap"; return 1; }
	grep -q "^$ZRAM_DEV " /proc/mounts && { echo "$ZRAM_DEV is mounted"; return 1; }
	grep -qw lz4 "/sys/block/$name/comp_algorithm" || { echo "$ZRAM_DEV has no lz4"; return 1; }
	# Set up by someone else, maybe in use: resetting it would take their data.
	[ "$(cat "/sys/block/$name/disksize")" = 0 ] ||
		{ echo "$ZRAM_DEV is set up (disksize $(cat "/sys/block/$name/disksize")); if it is not in use, echo 1 >/sys/block/$name/reset and run again"; return 1; }
	return 0
}

zram_reset() { echo 1 >"/sys/block/${ZRAM_DEV#/dev/}/reset"; }

zram_setup() {
	local sys=/sys/block/${ZRAM_DEV#/dev/}
	zram_reset
	ZRAM_SET=1
	echo lz4 >"$sys/comp_algorithm"
	echo "${SIZE_MIB}M" >"$sys/disksize"
}

# replay TARGET JOBS: one fio run; appends a row to $WORK/rows.
replay() {
	local target=$1 jobs=$2 engine c0 c1 out
	case "$target" in
	zram) engine=(--ioengine=libaio --direct=1 --replay_redirect="$ZRAM_DEV") ;;
	# The nbd engine ignores file names; and fio 3.33 crashes (double
	# free) with replay_redirect and more than one job there.
	*) engine=(--ioengine=nbd --uri="nbd+unix:///$EXPORT?socket=$SOCK") ;;
	esac
	out=$WORK/$target.$jobs.terse
	c0=$(cpu_busy)
	fio --name=replay "${engine[@]}" --read_iolog="$WORK/replay.iolog" --replay_no_stall=1 \
		--iodepth="$IODEPTH" --numjobs="$jobs" --group_reporting "${DATA[@]}" \
		--thinktime=1 --thinktime_blocks="$REPLAY_IOS" --thinktime_blocks_type=issue \
		--output-format=terse --terse-version=3 >"$out" 2>"$out.err" ||
		die "fio against $target ($jobs jobs) failed: $(tail -5 "$out.err")"
	c1=$(cpu_busy)
	grep -v '^bad ddir: 2$' "$out.err" | grep -v '^fio: connected to NBD server' >&2 || true
	# Terse v3: error (5), read KiB (6), read ms (9), write KiB (47),
	# write ms (50). A row: target, jobs, MB/s, CPU-s/GB, GB read, GB
	# written, seconds.
	awk -F';' -v t="$target" -v j="$jobs" -v c="$((c1 - c0))" -v tck="$TCK" '
		$1 == 3 && $5 == 0 {
			bytes = ($6 + $47) * 1024; ms = ($9 > $50 ? $9 : $50)
			printf "%s %d %.1f %.3f %.3f %.3f %.2f\n", t, j, bytes / ms / 1000, (c / tck) / (bytes / 1e9), $6 * 1024 / 1e9, $47 * 1024 / 1e9, ms / 1000
			found = 1
		}
		END { exit !found }' "$out" >>"$WORK/rows" || die "fio's report for $target ($jobs jobs): $(cat "$out")"
	log "$(tail -1 "$WORK/rows")"
}

: >"$WORK/rows"
skipped=()
for target in $TARGETS; do
	for jobs in $JOBS; do
		case "$target" in
		gzramd-cpu | gzramd-gpu)
			[ -x "$GZRAMD" ] || die "$GZRAMD not built (make build), or set GZRAMD"
			if ! gzramd_start "${target#gzramd-}"; then
				skipped+=("$target: gzramd --backend ${target#gzramd-} did not start: $(grep -E 'level=(ERROR|WARN)|^gzramd:|another backend' "$GZLOG" | tail -1)")
				log "${skipped[-1]}"
				break
			fi
			replay "$target" "$jobs"
			server_stop
			;;
		nbdkit)
			command -v nbdkit >/dev/null || {
				skipped+=("nbdkit: not installed (Debian package nbdkit; or the bundle)")
				break
			}
			nbdkit_start
			replay nbdkit "$jobs"
			server_stop
			;;
		zram)
			if ! why=$(zram_usable); then
				skipped+=("zram: $why")
				log "${skipped[-1]}"
				break
			fi
			zram_setup
			replay zram "$jobs"
			zram_reset
			ZRAM_SET=0
			;;
		*) die "unknown target $target (want gzramd-cpu, gzramd-gpu, zram, nbdkit)" ;;
		esac
	done
done

{
	echo "# Trace replay: $(basename "$TRACE")"
	echo
	echo "$(date -u +%Y-%m-%d), $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), Linux $(uname -r), $FIO_VERSION, gzramd $("$GZRAMD" version 2>/dev/null | awk '{ print $2 }')."
	echo "Trace: $(tstat reads) reads (mean $(mean read_bytes reads) KiB), $(tstat writes) writes (mean $(mean write_bytes writes) KiB, $(awk -v a="$(tstat writes_128k)" -v n="$(tstat writes)" 'BEGIN { printf "%.0f", n ? 100 * a / n : 0 }') % of them 128 KiB), $(tstat trims) trims, flushes: $(tstat syncs); device ${SIZE_MIB} MiB; trims $TRIMS; replayed ${REPEAT} times over in each job."
	echo "Load average before the run: $LOAD (a shared machine's other work counts in the CPU figures)."
	echo "fio: read_iolog, replay_no_stall=1, iodepth=$IODEPTH, each job the whole trace, buffer_compress_percentage=50, buffer_compress_chunk=4096; nbd engine over a Unix socket, zram with libaio direct=1."
	echo "CPU-s/GB: the whole machine's user+nice+system+irq+softirq+steal (/proc/stat) over the fio run, per 1e9 bytes read and written."
	echo
	# Ratios against kernel zram with the same number of jobs.
	awk '
		{ row[NR] = $0; if ($1 == "zram") { zmbs[$2] = $3; zcpu[$2] = $4 } }
		END {
			print "| target | jobs | MB/s | CPU-s per GB | MB/s vs zram | CPU/GB vs zram | GB read | GB written | s |"
			print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
			for (i = 1; i <= NR; i++) {
				split(row[i], f, " ")
				r1 = f[2] in zmbs ? sprintf("%.2f", f[3] / zmbs[f[2]]) : "-"
				r2 = f[2] in zcpu ? sprintf("%.2f", f[4] / zcpu[f[2]]) : "-"
				printf "| %s | %d | %.0f | %.2f | %s | %s | %.2f | %.2f | %.1f |\n", f[1], f[2], f[3], f[4], r1, r2, f[5], f[6], f[7]
			}
		}' "$WORK/rows"
	for s in "${skipped[@]}"; do
		echo
		echo "Skipped $s"
	done
	echo
	echo "Command: TRACE_TARGETS=\"$TARGETS\" TRACE_JOBS=\"$JOBS\" TRACE_IODEPTH=$IODEPTH TRACE_REPEAT=$REPEAT bench/trace.sh ${1:-}"
} >"$WORK/report.md"
cat "$WORK/report.md"
if [ -n "${TRACE_OUT:-}" ]; then
	cp "$WORK/report.md" "$TRACE_OUT"
	log "wrote $TRACE_OUT"
fi
