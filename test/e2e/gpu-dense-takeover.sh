#!/usr/bin/env bash
# On a machine with a GPU (the device tool's; no kernel NBD needed): the
# dense tier recompressing on the GPU across SIGKILLs of the serving
# process. gzramd serves on a unix socket with --backend gpu and
# --dense-after 1s; the corpus goes in with nbdcopy; once the GPU has
# recompressed groups, the serving process is killed, and its successor
# takes the device over on the CPU and opens the GPU late (serving.openLate),
# which hands it to the dense tier again. Half the corpus is then written
# again over a second half-kill cycle, and the device read back must be the
# corpus byte for byte.
#
# Needs GZRAMD (a gzramd binary), nbdcopy and python3 on PATH, and
# GZRAMD_CORPUS (the corpus, raw); GZRAMD_ARGS adds flags (objects of
# several pages the GPU makes: --object-pages 16, or --algorithm zstd
# --object-pages 4; not zstd objects of 16 pages, whole groups the dense
# tier leaves as they are, so that it waits for recompression in vain).
# Prints E2E-GPU-DENSE PASS or FAIL. A FAIL (a wait that timed out, a
# command that failed, SIGINT or SIGTERM) first says what ran: gzramd's
# processes and threads, who listens on the metrics port and the socket,
# the GPU's processes; then each gzramd process of the run dumps its
# goroutines into the log (SIGQUIT, one at a time, the others stopped
# meanwhile), and the log is printed from 300 lines before the dumps. With
# GZRAMD_DIAG_DIR set, the run's log and that diagnosis are kept there
# (a directory per run); the run's directory is removed otherwise.
set -euo pipefail
: "${GZRAMD:?a gzramd binary}" "${GZRAMD_CORPUS:?the corpus, raw}"
WORK=$(mktemp -d /tmp/gzramd-gpu-dense.XXXXXX)
SOCK=$WORK/sock LOG=$WORK/gzramd.log METRICS=127.0.0.1:19829
URI="nbd+unix:///gzramd?socket=$SOCK"
DAEMON=
# The names gzramd's processes go by (comm): the binary's as given, and as
# resolved (the serving processes are started from the resolved path).
GZCOMMS=" $(basename "$GZRAMD" | cut -c1-15) $(basename "$(readlink -f "$GZRAMD")" | cut -c1-15) "
# run_pids: "PID PPID COMM" of this run's gzramd processes: the
# supervisor, its gzramd descendants (serving processes, the standby,
# gpu-compile, a dead one not yet reaped), and any gzramd whose arguments
# name $WORK (a serving process whose supervisor died). Nothing else, ever:
# diagnose stops and kills what it lists.
run_pids() {
	ps -eo pid=,ppid=,comm=,args= | awk -v top="${DAEMON:-0}" -v work="$WORK" -v comms="$GZCOMMS" '
		{ pid[NR] = $1; ppid[NR] = $2; gz[NR] = index(comms, " " $3 " ") > 0; comm[NR] = $3
		  named[NR] = work != "" && index($0, work) > 0 }
		END {
			if (top > 1)
				keep[top] = 1
			for (more = 1; more; ) {
				more = 0
				for (i = 1; i <= NR; i++)
					if (gz[i] && !(pid[i] in keep) && (ppid[i] in keep || named[i])) {
						keep[pid[i]] = 1
						more = 1
					}
			}
			for (i = 1; i <= NR; i++)
				if (gz[i] && pid[i] in keep)
					print pid[i], ppid[i], comm[i]
		}'
}
# gone PID: it has exited (reaped, or a zombie).
gone() {
	local s
	s=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
	case $s in Z*) return 0 ;; esac
	return 1
}
# diagnose: what the run's processes are doing, then their goroutines.
diagnose() {
	local p pp t state lines
	echo "--- diagnosis at $(date -u +%T.%N) UTC (the log's clock); load: $(cut -d' ' -f1-3 /proc/loadavg)"
	local procs
	procs=$(run_pids)
	echo "--- gzramd processes of this run (supervisor ${DAEMON:-none}):"
	[ -n "$procs" ] && ps -o pid,ppid,stat,etime,wchan:24,args -p "$(echo "$procs" | awk '{print $1}' | paste -sd,)"
	echo "--- their threads:"
	[ -n "$procs" ] && ps -L -o pid,tid,stat,wchan:32,comm -p "$(echo "$procs" | awk '{print $1}' | paste -sd,)"
	# Kernel stacks (root) of threads in D state, and of every thread of a
	# process being torn down (its memory gone, VmSize with it): a dead
	# serving process whose GPU context is still being released holds its
	# sockets so.
	echo "$procs" | while read -r p _ _; do
		[ -n "$p" ] || continue
		local exiting=
		grep -q '^VmSize' "/proc/$p/status" 2>/dev/null || exiting=1
		for t in /proc/"$p"/task/*; do
			state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "$t/status" 2>/dev/null)
			if [ "$state" = D ] || [ -n "$exiting" ]; then
				echo "--- kernel stack of pid $p thread ${t##*/} (state $state${exiting:+, exiting}):"
				cat "$t/stack" 2>/dev/null || echo "(unreadable)"
			fi
		done
	done
	# What the dense tier did in the serving process (recompressed on the
	# GPU or the CPU, declined, raced, kept), if it answers.
	echo "--- the dense tier's metrics and the tiers (nothing: /metrics did not answer):"
	python3 -c 'import urllib.request; print(urllib.request.urlopen("http://'"$METRICS"'/metrics", timeout=5).read().decode())' 2>/dev/null |
		grep -E '^gzramd_(dense_|tier_|packed_|stored_pages)' || true
	echo "--- listening on the metrics port ${METRICS##*:} (refused means no one):"
	if command -v ss >/dev/null; then
		ss -ltnp "sport = :${METRICS##*:}"
		echo "--- the TCP sockets of that port, but those in TIME-WAIT:"
		ss -tanp exclude time-wait "( sport = :${METRICS##*:} or dport = :${METRICS##*:} )"
		echo "--- the NBD socket $SOCK:"
		ss -xap | grep -F "$SOCK"
	else
		echo "(no ss)"
	fi
	if command -v nvidia-smi >/dev/null; then
		echo "--- GPU processes (a dead serving process's context may still be released):"
		timeout 20 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
	fi
	[ -n "$procs" ] || return 0
	# gzramd catches no SIGQUIT: Go writes every goroutine's stack to
	# stderr, the log, and exits 2. One process at a time, the others
	# stopped, so that the dumps do not interleave and the supervisor does
	# not start another serving process meanwhile; children first (a
	# gpu-compile dies with its parent), the supervisor last.
	lines=$(wc -l <"$LOG")
	echo "$procs" | awk '{print $1}' | xargs -r kill -STOP 2>/dev/null
	{
		echo "$procs" | awk -v top="${DAEMON:-0}" '$1 != top && $2 != top'
		echo "$procs" | awk -v top="${DAEMON:-0}" '$1 != top && $2 == top'
		echo "$procs" | awk -v top="${DAEMON:-0}" '$1 == top'
	} | while read -r p pp _; do
		echo "--- SIGQUIT to pid $p (parent $pp) at $(date -u +%T.%N) UTC"
		kill -QUIT "$p" 2>/dev/null && kill -CONT "$p" 2>/dev/null
		for _ in $(seq 30); do gone "$p" && break; sleep 0.1; done
		gone "$p" || echo "pid $p still runs 3 s after SIGQUIT (state $(ps -o stat= -p "$p")): no dump; see its kernel stacks above"
	done
	echo "$procs" | awk '{print $1}' | xargs -r kill -CONT 2>/dev/null
	sleep 1
	echo "--- the log, from 300 lines before the goroutine dumps (each begins 'SIGQUIT: quit'):"
	tail -n +$((lines > 300 ? lines - 299 : 1)) "$LOG"
}
fail() {
	set +e
	trap - ERR INT TERM
	echo "E2E-GPU-DENSE FAIL: $*"
	diagnose 2>&1 | tee "$WORK/diagnosis.txt"
	if [ -n "${GZRAMD_DIAG_DIR:-}" ]; then
		local keep
		keep=$GZRAMD_DIAG_DIR/$(basename "$WORK")
		# The logs, not the corpus's copies.
		mkdir -p "$keep" && find "$WORK" -maxdepth 1 -type f ! -name half ! -name back -exec cp {} "$keep/" \; &&
			echo "E2E-GPU-DENSE: the log and the diagnosis are kept in $keep"
	fi
	exit 1
}
. "$(dirname "$0")/../../bench/lib.sh" # gzramd_metric, on BENCH_METRICS
BENCH_METRICS=$METRICS
# A command that fails outside a test of its own, SIGINT and SIGTERM (a
# harness's timeout) are FAILs too, diagnosed (lib.sh's traps replaced).
trap 'fail "line $LINENO: status $? of: $BASH_COMMAND"' ERR
trap 'fail "interrupted by a signal"' INT TERM
trap 'rm -rf "$WORK"' EXIT # until gzramd runs: stop_daemon
metric() { python3 -c "print(int(float('$(gzramd_metric "$@")')))"; }
serving_pid() {
	python3 -c 'import json,sys,urllib.request; print(json.load(urllib.request.urlopen("http://'"$METRICS"'/status", timeout=5))["pid"])'
}
# wait_for WHAT SECONDS CMD...: until CMD succeeds, for SECONDS of wall
# clock: a hung daemon is a FAIL that says what it waited for, not
# silence (a count of tries was not: each poll may block 5 s, its HTTP
# timeout).
wait_for() {
	local what=$1 limit=$2
	local deadline=$((SECONDS + limit))
	shift 2
	while [ "$SECONDS" -lt "$deadline" ]; do
		"$@" 2>/dev/null && return 0
		sleep 0.1
	done
	fail "$what (waited ${limit} s)"
}
# copy SRC DST: nbdcopy, failed after 5 minutes (the corpus takes seconds).
copy() {
	timeout 300 nbdcopy --synchronous "$1" "$2" || fail "nbdcopy $1 $2 failed or hung (status $?)"
}
gpu_groups_above() { [ "$(metric gzramd_dense_gpu_groups_total 'result="compressed"')" -gt "$1" ]; }
ready() { serving_pid >/dev/null; }
# took_over PID: a serving process other than PID answers /status (a
# refused or failed poll is no answer).
took_over() {
	local p
	p=$(serving_pid) && [ -n "$p" ] && [ "$p" != "$1" ]
}
# logged TEXT N: the log has TEXT at least N times.
logged() { [ "$(grep -c "$1" "$LOG")" -ge "$2" ]; }
size=$(stat -c %s "$GZRAMD_CORPUS")
# shellcheck disable=SC2086 # GZRAMD_ARGS is a list of flags
"$GZRAMD" serve --size 256M --socket "$SOCK" --export gzramd --metrics "$METRICS" --backend gpu \
	--dense-after 1s --dense-cpu 1 --prefault 0 ${GZRAMD_ARGS:-} >"$LOG" 2>&1 &
DAEMON=$!
# At the end: gzramd stopped (SIGTERM), at most 30 s waited for, else
# diagnosed and killed, so that a stop that hangs hangs nothing here.
stop_daemon() {
	set +e
	trap - ERR INT TERM
	kill "$DAEMON" 2>/dev/null
	for _ in $(seq 300); do gone "$DAEMON" && break; sleep 0.1; done
	if ! gone "$DAEMON"; then
		echo "E2E-GPU-DENSE: gzramd (supervisor $DAEMON) still runs 30 s after SIGTERM"
		diagnose 2>&1 | tail -400
		run_pids | awk '{print $1}' | xargs -r kill -9 2>/dev/null
	fi
	wait "$DAEMON" 2>/dev/null
	rm -rf "$WORK"
}
trap stop_daemon EXIT
wait_for "gzramd did not come up" 60 ready
grep -q "the dense tier recompresses on the GPU" "$LOG" || fail "the dense tier did not take the GPU at start"
copy "$GZRAMD_CORPUS" "$URI"
wait_for "the GPU recompressed no group in 60 s" 60 gpu_groups_above 0
for round in 1 2; do
	pid=$(serving_pid)
	# The process /status names must be the supervisor's child: never kill
	# another.
	[ "$(ps -o ppid= -p "$pid" | tr -d ' ')" = "$DAEMON" ] ||
		fail "round $round: /status names pid $pid, which is not a child of the supervisor $DAEMON"
	kill -9 "$pid"
	echo "round $round: killed serving process $pid at $(date -u +%T.%N | cut -c1-12) UTC"
	wait_for "no process took the device over (round $round)" 60 took_over "$pid"
	wait_for "the GPU did not open after the takeover, or the dense tier did not take it (round $round)" 90 \
		logged "the dense tier recompresses on the GPU" $((round + 1))
	# Half the corpus again (the same bytes, so the comparison holds),
	# which moves its groups back to the fast tier to age again.
	python3 - "$GZRAMD_CORPUS" "$WORK/half" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(data[: len(data) // 2 // 65536 * 65536])
PY
	# Read before the copy: the copy's first groups may age and go to the
	# GPU before it ends.
	before=$(metric gzramd_dense_gpu_groups_total 'result="compressed"')
	copy "$WORK/half" "$URI"
	wait_for "the late GPU recompressed no group in 60 s (round $round)" 60 gpu_groups_above "$before"
done
copy "$URI" "$WORK/back"
cmp -n "$size" "$GZRAMD_CORPUS" "$WORK/back" || fail "the device does not read back as the corpus"
echo "E2E-GPU-DENSE PASS${GZRAMD_ARGS:+ ($GZRAMD_ARGS)}: $(grep -c 'took the device over' "$LOG") takeovers, $(metric gzramd_dense_gpu_groups_total 'result="compressed"') groups recompressed on the GPU since the last, $(metric gzramd_tier_pages 'tier="dense"') dense pages, $(metric gzramd_packed_objects) objects of several pages"
