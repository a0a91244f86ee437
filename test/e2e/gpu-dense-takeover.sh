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
# Prints E2E-GPU-DENSE PASS or FAIL.
set -euo pipefail
: "${GZRAMD:?a gzramd binary}" "${GZRAMD_CORPUS:?the corpus, raw}"
WORK=$(mktemp -d /tmp/gzramd-gpu-dense.XXXXXX)
SOCK=$WORK/sock LOG=$WORK/gzramd.log METRICS=127.0.0.1:19829
URI="nbd+unix:///gzramd?socket=$SOCK"
fail() {
	echo "E2E-GPU-DENSE FAIL: $*"
	tail -30 "$LOG"
	exit 1
}
. "$(dirname "$0")/../../bench/lib.sh" # gzramd_metric, on BENCH_METRICS
BENCH_METRICS=$METRICS
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
# logged TEXT N: the log has TEXT at least N times.
logged() { [ "$(grep -c "$1" "$LOG")" -ge "$2" ]; }
size=$(stat -c %s "$GZRAMD_CORPUS")
# shellcheck disable=SC2086 # GZRAMD_ARGS is a list of flags
"$GZRAMD" serve --size 256M --socket "$SOCK" --export gzramd --metrics "$METRICS" --backend gpu \
	--dense-after 1s --dense-cpu 1 --prefault 0 ${GZRAMD_ARGS:-} >"$LOG" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$WORK"' EXIT
wait_for "gzramd did not come up" 60 ready
grep -q "the dense tier recompresses on the GPU" "$LOG" || fail "the dense tier did not take the GPU at start"
copy "$GZRAMD_CORPUS" "$URI"
wait_for "the GPU recompressed no group in 60 s" 60 gpu_groups_above 0
for round in 1 2; do
	pid=$(serving_pid)
	kill -9 "$pid"
	echo "round $round: killed serving process $pid"
	wait_for "no process took the device over" 60 sh -c '[ "$(python3 -c "import json,urllib.request; print(json.load(urllib.request.urlopen(\"http://'"$METRICS"'/status\", timeout=5))[\"pid\"])")" != '"$pid"' ]'
	wait_for "the GPU did not open after the takeover, or the dense tier did not take it (round $round)" 90 \
		logged "the dense tier recompresses on the GPU" $((round + 1))
	# Half the corpus again (the same bytes, so the comparison holds),
	# which moves its groups back to the fast tier to age again.
	python3 - "$GZRAMD_CORPUS" "$WORK/half" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(data[: len(data) // 2 // 65536 * 65536])
PY
	copy "$WORK/half" "$URI"
	before=$(metric gzramd_dense_gpu_groups_total 'result="compressed"')
	wait_for "the late GPU recompressed no group in 60 s (round $round)" 60 gpu_groups_above "$before"
done
copy "$URI" "$WORK/back"
cmp -n "$size" "$GZRAMD_CORPUS" "$WORK/back" || fail "the device does not read back as the corpus"
echo "E2E-GPU-DENSE PASS${GZRAMD_ARGS:+ ($GZRAMD_ARGS)}: $(grep -c 'took the device over' "$LOG") takeovers, $(metric gzramd_dense_gpu_groups_total 'result="compressed"') groups recompressed on the GPU since the last, $(metric gzramd_tier_pages 'tier="dense"') dense pages, $(metric gzramd_packed_objects) objects of several pages"
