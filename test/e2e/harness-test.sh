#!/usr/bin/env bash
# Checks the survive harness's own judgement on made-up consoles, no guest
# (a few seconds): ./test/e2e/harness-test.sh [KEEP_DIR]
#
# 1. The stall watch (run.sh's guest_watch, lib.sh's served_since_last_kill)
#    on a console larger than a pipe buffer: a served line after the last
#    E2E-KILL is no stall, its absence is. The pipeline it replaced,
#    `tac | tr | sed '/^E2E-KILL /q' | grep -q` under pipefail, is run on
#    the same files to show the bug (issue 26): tac dies of SIGPIPE once
#    sed quits, the pipeline fails, and a takeover that served reads as a
#    stall.
# 2. survive.py on consoles where a kill lands on a takeover's successor
#    before it took over (an upgrade's, a kill's): allowed and reported
#    while nothing was lost, a failure when a page was lost or the kernel
#    logged an I/O error.
# With KEEP_DIR the consoles are kept there.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
dir=${1:-}
if [ -n "$dir" ]; then
	mkdir -p "$dir"
else
	dir=$(mktemp -d)
	trap 'rm -rf "$dir"' EXIT
fi
failed=0
check() { # name want(0|1) got
	if [ "$2" = "$3" ]; then
		echo "ok   $1"
	else
		echo "FAIL $1: want $2, got $3"
		failed=1
	fi
}

# --- 1. the stall watch ---------------------------------------------------
# A survive console as the host sees it (CRLF, gzramd's log lines, kernel
# noise), 2 MiB before the last kill: far more than a pipe holds.
noise() {
	local i
	for ((i = 0; i < $1; i++)); do
		printf '[ %4d.%06d] block nbd0: Connection timed out, retrying (2/2 alive) %0120d\r\n' $i $i 0
	done
}
{
	printf 'E2E-STEP: survive: hog 416 MiB\r\n'
	noise 6000
	printf 'E2E-KILL 1 pid=300 after=4.1s uptime=80.0 (serving)\r\n'
	printf 'time=x level=INFO msg="serving again after the takeover" pause=400ms\r\n'
	noise 6000
	printf 'E2E-KILL 2 pid=301 after=0.1s uptime=90.0 (takeover)\r\n'
	noise 5000
} >"$dir/stalled.console"
{
	cat "$dir/stalled.console"
	printf 'time=x level=WARN msg="took the device over from a serving process that died" found="1 pages stored"\r\n'
	printf 'time=x level=INFO msg="serving again after the takeover" pause=512ms\r\n'
	noise 20
} >"$dir/served.console"
echo "consoles: $(stat -c '%n %s bytes' "$dir/served.console" "$dir/stalled.console" | tr '\n' ' ')"

old_stalled() { # the watch's condition before issue 26: true means "stall"
	! tac "$1" | tr -d '\r' | sed '/^E2E-KILL /q' | grep -aqE 'msg="(serving again after the takeover|gzramd ready)"'
}
new_stalled() { ! served_since_last_kill "$1"; }

r=0
old_stalled "$dir/served.console" || r=$?
if [ "$r" = 0 ]; then
	echo "bug  reproduced: the old pipeline calls $dir/served.console a stall (it served after the last kill)"
else
	echo "note the old pipeline did not misfire this time (tac finished before sed quit?)"
fi
r=0; old_stalled "$dir/stalled.console" || r=$?
check "old pipeline: no served line after the last kill is a stall" 0 "$r"
r=0; new_stalled "$dir/served.console" || r=$?
check "stall watch: served after the last kill is no stall" 1 "$r"
r=0; new_stalled "$dir/stalled.console" || r=$?
check "stall watch: nothing served after the last kill is a stall" 0 "$r"
r=0; new_stalled "$dir/missing.console" || r=$?
check "stall watch: an unreadable console is a stall" 0 "$r"
# What run.sh's guest_watch does, the same way (pipefail, set -e).
guest_watch_verdict() {
	if [ "$(grep -ac '^E2E-KILL ' "$1" || true)" != 0 ] && ! served_since_last_kill "$1"; then
		echo stall
	else
		echo fine
	fi
}
check "guest_watch condition on the served console" fine "$(guest_watch_verdict "$dir/served.console")"
check "guest_watch condition on the stalled console" stall "$(guest_watch_verdict "$dir/stalled.console")"
# Many times over: the old bug was a race (it depends on when tac
# writes); the new check has no pipeline to race.
n_old=0 n_new=0
for _ in $(seq 20); do
	old_stalled "$dir/served.console" && n_old=$((n_old + 1))
	new_stalled "$dir/served.console" && n_new=$((n_new + 1))
done
echo "20 tries on the served console: the old pipeline called it a stall $n_old times, the new check $n_new times"
check "stall watch: no false stall in 20 tries" 0 "$n_new"

# A real console too, with E2E_STALL_CONSOLE=FILE (a passing survive run's,
# e.g. kept with E2E_SURVIVE_KEEP_CONSOLE): as it is it served after its
# last kill; cut just after that kill it did not.
if [ -n "${E2E_STALL_CONSOLE:-}" ]; then
	real=$E2E_STALL_CONSOLE
	cut=$dir/real-cut.console
	last=$(awk '/^E2E-KILL / { n = NR } END { print n + 0 }' "$real")
	[ "$last" -gt 0 ] || { echo "FAIL $real has no E2E-KILL line"; exit 1; }
	awk -v n="$last" 'NR <= n' "$real" >"$cut"
	echo "real console $real: $(stat -c %s "$real") bytes, its last E2E-KILL on line $last, $(stat -c %s "$cut") bytes up to it"
	r=0; old_stalled "$real" || r=$?
	[ "$r" = 0 ] && echo "bug  reproduced on $real: the old pipeline calls it a stall" ||
		echo "note the old pipeline did not misfire on $real"
	r=0; new_stalled "$real" || r=$?
	check "stall watch: the real console served after its last kill" 1 "$r"
	r=0; new_stalled "$cut" || r=$?
	check "stall watch: the real console cut after its last kill is a stall" 0 "$r"
fi

# --- 2. survive.py on interleavings ---------------------------------------
# console NAME LINE...: a survive console of the given lines.
console() {
	local name=$1
	shift
	printf '%s\r\n' "$@" >"$dir/$name.console"
}
started() { echo "time=x level=INFO msg=\"serving process started\" pid=$1 takeovers=$2"; }
died_line='time=x level=WARN msg="took the device over from a serving process that died" found="100 pages stored, 0 same-filled, 0 staged (now stored)" takeovers=N'
handed_line='time=x level=INFO msg="took the device over from the serving process before this one, which handed it over (an upgrade)" found="100 pages stored" takeovers=N'
served_line='time=x level=INFO msg="serving again after the takeover" pause=400ms'
ready_line='time=x level=INFO msg="gzramd ready" version=x algorithm=lz4 backend=cpu'
# end TAKEOVERS LOST IO: the guest's closing lines.
end() {
	echo "HOG-PASS 416 MiB verified twice"
	echo "E2E-SURVIVE kills=3 upgrades=1"
	echo "E2E-SURVIVE takeovers_total=$1 lost_pages=$2 last_pause_seconds=0.4"
	echo "E2E-SURVIVE io_error_lines=$3"
}
# 3 kills, 1 upgrade, every takeover done.
base=(
	"$(started 100 0)" "$ready_line"
	"E2E-STEP: survive: hog 416 MiB"
	"$(started 101 1)" "$handed_line" "$ready_line"
	"E2E-UPGRADE 1 old=100 new=101 took=0.5s kernel_nbd_lines=0"
	"E2E-KILL 1 pid=101 after=4.0s uptime=50 (serving)"
	"$(started 102 2)" "$died_line"
	"E2E-KILL 2 pid=102 after=0.1s uptime=55 (takeover)"
	"$(started 103 3)" "$died_line" "$served_line"
	"hog: wrote 416 of 416 MiB (60 s)"
	"E2E-KILL 3 pid=103 after=4.0s uptime=70 (serving)"
	"$(started 104 4)" "$died_line" "$served_line"
)
# Upgrade 1's successor killed before it took over: no "handed it over".
upgrade_cut=(
	"$(started 100 0)" "$ready_line"
	"E2E-STEP: survive: hog 416 MiB"
	"$(started 101 1)"
	"E2E-UPGRADE 1 old=100 new=101 took=0.5s kernel_nbd_lines=0"
	"E2E-KILL 1 pid=101 after=4.0s uptime=50 (serving)"
	"$(started 102 2)" "$died_line"
	"E2E-KILL 2 pid=102 after=0.1s uptime=55 (takeover)"
	"$(started 103 3)" "$died_line" "$served_line"
	"hog: wrote 416 of 416 MiB (60 s)"
	"E2E-KILL 3 pid=103 after=4.0s uptime=70 (serving)"
	"$(started 104 4)" "$died_line" "$served_line"
)
# Kill 2 lands on kill 1's successor before it took over.
kill_cut=(
	"$(started 100 0)" "$ready_line"
	"E2E-STEP: survive: hog 416 MiB"
	"$(started 101 1)" "$handed_line" "$ready_line"
	"E2E-UPGRADE 1 old=100 new=101 took=0.5s kernel_nbd_lines=0"
	"E2E-KILL 1 pid=101 after=4.0s uptime=50 (serving)"
	"$(started 102 2)"
	"E2E-KILL 2 pid=102 after=3.0s uptime=55 (serving)"
	"$(started 103 3)" "$died_line" "$served_line"
	"hog: wrote 416 of 416 MiB (60 s)"
	"E2E-KILL 3 pid=103 after=4.0s uptime=70 (serving)"
	"$(started 104 4)" "$died_line" "$served_line"
)
survive() { # name want-exit [grep pattern the output must have]
	local out r=0
	out=$(python3 "$E2E_DIR/survive.py" "$dir/$1.console" 3 2 1 2>&1) || r=$?
	echo "$out" | sed 's/^/       /'
	check "survive.py $1" "$2" "$r"
	if [ -n "${3:-}" ] && ! grep -qE -- "$3" <<<"$out"; then
		echo "FAIL survive.py $1: output lacks /$3/"
		failed=1
	fi
}
console plain "${base[@]}" "$(end 4 0 0)"
survive plain 0
console plain-miscount "${base[@]}" "$(end 3 0 0)"
survive plain-miscount 1 'gzramd_takeovers_total=3 but 3 kills and 1 upgrades'
console upgrade-cut "${upgrade_cut[@]}" "$(end 3 0 0)"
survive upgrade-cut 0 'upgrade 1 interrupted by kill 1 before it took over'
console upgrade-cut-late "${upgrade_cut[@]}" "$(end 4 0 0)" # killed between the count and the log line
survive upgrade-cut-late 0 'upgrade 1 interrupted by kill 1'
console upgrade-cut-lost "${upgrade_cut[@]}" "$(end 3 1 0)"
survive upgrade-cut-lost 1 'not allowed for \(gzramd_lost_pages=1\)'
console upgrade-cut-eio "${upgrade_cut[@]}" "$(end 3 0 2)"
survive upgrade-cut-eio 1 'not allowed for \(2 kernel I/O error lines\)'
console upgrade-cut-hogfail "${upgrade_cut[@]}" "HOG-FAIL 1 wrong words" "E2E-SURVIVE kills=3 upgrades=1" \
	"E2E-SURVIVE takeovers_total=3 lost_pages=0 last_pause_seconds=0.4" "E2E-SURVIVE io_error_lines=0"
survive upgrade-cut-hogfail 1 'not allowed for \(the hog did not pass\)'
console kill-cut "${kill_cut[@]}" "$(end 3 0 0)"
survive kill-cut 0 'kill 2 landed on the successor of kill 1 before it took over'
console kill-cut-lost "${kill_cut[@]}" "$(end 3 0 0)"
sed -i 's/found="100 pages stored, 0 same-filled, 0 staged (now stored)"/found="100 pages stored, 1 LOST (first: page 7)"/' "$dir/kill-cut-lost.console"
survive kill-cut-lost 1 'a takeover lost pages'

[ "$failed" = 0 ] && echo "harness-test: PASS" || echo "harness-test: FAIL"
exit "$failed"
