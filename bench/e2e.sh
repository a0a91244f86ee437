#!/usr/bin/env bash
# End-to-end benchmark: fio's nbd engine over a Unix socket against gzramd
# and against nbdkit's memory plugin, in the same run, on the same machine.
# Writes bench/results/e2e-<backend>.md (table, machine) and .png (plot).
#
# Environment:
#   E2E_BENCH_RUNTIME  seconds per fio job (default 10; ramp 2 s on top)
#   E2E_BENCH_BACKEND  gzramd --backend (default auto; the file is named
#                      after the backend the daemon reports)
#   E2E_BENCH_OUT      output directory (default bench/results)
#   GZRAMD             the daemon binary (default bin/gzramd)
#   E2E_NO_DEPS=1      do not install Debian packages (tools come on PATH)
#   E2E_NBDKIT_MEMORY  nbdkit's memory plugin: a name or a .so path
#   E2E_GZRAMD_ARGS    more gzramd serve flags (split on spaces)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/test/e2e/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

RUNTIME=${E2E_BENCH_RUNTIME:-10}
RAMP=${E2E_BENCH_RAMP:-2}
BACKEND=${E2E_BENCH_BACKEND:-auto}
OUT=${E2E_BENCH_OUT:-$ROOT/bench/results}
GZRAMD=${GZRAMD:-$ROOT/bin/gzramd}
CORPUS=${E2E_CORPUS:-$ROOT/../shared/corpus/memory-pages.bin.zst}
SIZE_MIB=1024   # device size
REGION=512M     # the part of it fio touches
EXPORT=gzram0

if [ "${E2E_NO_DEPS:-0}" != 1 ]; then
	E2E_WITH_PLOT=1 "$ROOT/test/e2e/deps.sh" || log "plot dependencies missing: the table only"
fi
[ -x "$GZRAMD" ] || die "$GZRAMD not built (make build)"
for t in fio nbdkit nbdcopy zstd python3; do
	command -v "$t" >/dev/null || die "$t missing (test/e2e/deps.sh installs it as root)"
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"

WORK=$(mktemp -d /tmp/gzramd-bench.XXXXXX)
E2E_TMPS+=("$WORK")
TCK=$(getconf CLK_TCK)

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# start NAME: starts the server NAME on $WORK/NAME.sock; sets PID.
start() {
	local name=$1 sock=$WORK/$1.sock
	rm -f "$sock"
	case "$name" in
	gzramd)
		GZ_MPORT=$(free_port)
		"$GZRAMD" serve --size "${SIZE_MIB}MiB" --socket "$sock" --export "$EXPORT" \
			--metrics "127.0.0.1:$GZ_MPORT" --backend "$BACKEND" ${E2E_GZRAMD_ARGS:-} >"$WORK/$name.log" 2>&1 &
		;;
	nbdkit)
		nbdkit -f -U "$sock" "${E2E_NBDKIT_MEMORY:-memory}" "${SIZE_MIB}M" >"$WORK/$name.log" 2>&1 &
		;;
	esac
	PID=$!
	E2E_PIDS+=("$PID")
	# gzramd: until it says it is ready, after its heap is faulted in, so
	# that the resident memory measured before the corpus includes that.
	for _ in $(seq 100); do
		if [ -S "$sock" ] && { [ "$name" != gzramd ] || grep -q 'msg="gzramd ready"' "$WORK/$name.log"; }; then
			return 0
		fi
		kill -0 "$PID" 2>/dev/null || break
		sleep 0.1
	done
	cat "$WORK/$name.log" >&2
	die "$name did not come up"
}

stop() {
	kill "$PID" 2>/dev/null || true
	wait "$PID" 2>/dev/null || true
}

uri() { echo "nbd+unix:///$EXPORT?socket=$WORK/$1.sock"; }

# job NAME RW BS QD JOBS: one fio run against the server in $PID, with
# the server's CPU time around it, into $WORK/<server>.<NAME>.json.
job() {
	local server=$1 name=$2 rw=$3 bs=$4 qd=$5 jobs=$6 t0 t1
	t0=$(cpu_ticks "$PID")
	fio --name="$name" --ioengine=nbd --uri="$(uri "$server")" --rw="$rw" --bs="$bs" \
		--iodepth="$qd" --numjobs="$jobs" --group_reporting --size="$REGION" \
		--time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
		--buffer_compress_percentage=50 --buffer_compress_chunk=4096 \
		--output-format=json --output="$WORK/$server.$name.json" >/dev/null ||
		die "fio $name against $server failed"
	t1=$(cpu_ticks "$PID")
	# The ramp's CPU is in t1-t0 but its bytes are not in fio's totals:
	# scale by runtime/(runtime+ramp) to match.
	echo "$server $name $t0 $t1 $TCK $RUNTIME $RAMP" >>"$WORK/cpu.txt"
	log "$server: $name done"
}

# corpus SERVER: writes the shared corpus through nbdcopy, reads it back
# to compare, and records the server's resident memory.
corpus() {
	local server=$1 before after
	[ -s "$WORK/corpus.bin" ] || return 0
	before=$(rss_kib "$PID")
	nbdcopy "$WORK/corpus.bin" "$(uri "$server")" || die "nbdcopy corpus → $server"
	after=$(rss_kib "$PID")
	# cmp stops after the corpus; nbdcopy then dies of SIGPIPE, unseen.
	cmp -n "$(stat -c %s "$WORK/corpus.bin")" <(nbdcopy "$(uri "$server")" - 2>/dev/null) "$WORK/corpus.bin" ||
		die "$server returned the corpus changed"
	echo "$server $before $after $(stat -c %s "$WORK/corpus.bin")" >>"$WORK/rss.txt"
	if [ "$server" = gzramd ]; then
		python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
			"http://127.0.0.1:$GZ_MPORT/metrics" >"$WORK/gzramd.corpus.metrics" 2>/dev/null || true
	fi
}

if [ -s "$CORPUS" ]; then
	zstd -q -d -f "$CORPUS" -o "$WORK/corpus.bin"
else
	log "no corpus at $CORPUS: memory figures skipped"
fi

for server in gzramd nbdkit; do
	# Memory first, on a fresh server: only the corpus is in it.
	start "$server"
	corpus "$server"
	if [ "$server" = gzramd ]; then
		grep -o 'backend=[a-z]*' "$WORK/gzramd.log" | tail -1 | cut -d= -f2 >"$WORK/backend" || true
		grep -o 'version=[^ ]*' "$WORK/gzramd.log" | tail -1 | cut -d= -f2 >"$WORK/version" || true
	fi
	stop
	start "$server"
	# The sequential write fills the region the reads then read.
	job "$server" seqwrite-1M write 1M 8 1
	job "$server" seqread-1M read 1M 8 1
	for rw in randwrite randread; do
		for jobs in 1 4; do
			for qd in 1 32; do
				job "$server" "$rw-4k-qd$qd-j$jobs" "$rw" 4k "$qd" "$jobs"
			done
		done
	done
	stop
done

backend=$(cat "$WORK/backend" 2>/dev/null || true)
backend=${backend:-$BACKEND}
mkdir -p "$OUT"
# Debian's python3 has python3-matplotlib; a python3 earlier on PATH may not.
PY=python3
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PY=/usr/bin/python3
"$PY" "$ROOT/test/e2e/bench_report.py" --work "$WORK" --backend "$backend" \
	--md "$OUT/e2e-$backend.md" --png "$OUT/e2e-$backend.png" \
	--command "make bench-e2e (bench/e2e.sh, E2E_BENCH_RUNTIME=$RUNTIME, ramp $RAMP s${E2E_GZRAMD_ARGS:+, gzramd serve $E2E_GZRAMD_ARGS})"
log "wrote $OUT/e2e-$backend.md"
cat "$OUT/e2e-$backend.md"
