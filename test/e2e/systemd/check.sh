#!/bin/bash
# The checks of test/e2e/systemd.sh, run inside the Debian guest by
# gzramd-e2e.service at every boot.
#
# Boot 1: gzramd is installed where `make install` puts it, and this
# script goes on as README.md's "With systemd" does (daemon-reload,
# enable --now); then readiness, hardening, a memory hog through the swap
# with the watchdog watched meanwhile, a clean stop, a start again, data
# left in swap, and a real `systemctl reboot`.
# Boot 2: the enabled unit turned swap on again by itself, and boot 1's
# shutdown stopped it cleanly, after reading the swapped data back.
#
# Each check prints "E2E-CHECK: PASS|FAIL name: detail" on the console. The
# first failure ends the run ("E2E-RESULT: FAIL ...", with the unit's
# status and journal); boot 2 ends it with "E2E-RESULT: PASS".
# Parameters come on the kernel command line: e2e.hog=MIB (the hog),
# e2e.hold=MIB and e2e.push=MIB (the holder and the hog that pushes it
# into swap), e2e.seed=N, e2e.transport=nbd|ublk (what the env file asks
# gzramd to serve the kernel device with: /dev/nbdN or /dev/ublkbN).
set -euo pipefail

UNIT=gzramd.service
# Plain text on the serial console: no colours, no hyperlinks.
export SYSTEMD_COLORS=0 SYSTEMD_URLIFY=0
LIB=/usr/local/lib/gzramd-e2e
STATE=/var/lib/gzramd-e2e # on disk: which boot this is
RUN=/run/gzramd-e2e       # this boot's scratch files
mkdir -p "$STATE" "$RUN"

hog_mib=640 hold_mib=128 push_mib=320 seed=1 transport=nbd
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	e2e.hog=*) hog_mib=${arg#*=} ;;
	e2e.hold=*) hold_mib=${arg#*=} ;;
	e2e.push=*) push_mib=${arg#*=} ;;
	e2e.seed=*) seed=${arg#*=} ;;
	e2e.transport=*) transport=${arg#*=} ;;
	esac
done

step() { echo "E2E-STEP: $*"; }
pass() { echo "E2E-CHECK: PASS $*"; }
# fail NAME: DETAIL. The evidence goes to the console before the verdict,
# so the host's tail of the console shows it.
fail() {
	echo "E2E-CHECK: FAIL $*"
	evidence
	result "FAIL $*"
}
verdict=
result() {
	verdict=$*
	echo "E2E-RESULT: $*"
	sync
	systemctl poweroff --no-block || true
	exit 0
}
# A command that fails where no check expected it (set -e) is a failure
# too, not a silent end. (Not an ERR trap: that would also fire inside
# command substitutions, whose output is captured.)
on_exit() {
	local rc=$? cmd=$BASH_COMMAND
	[ -n "$verdict" ] || [ "${rebooting:-0}" = 1 ] || fail "unexpected: '$cmd' ended the checks with status $rc"
}
trap on_exit EXIT

evidence() {
	echo "---- systemctl status $UNIT ----"
	systemctl status --no-pager -l -n 0 "$UNIT" 2>&1 || true
	echo "---- journal of $UNIT, this boot (last 80 lines) ----"
	journalctl -b -u "$UNIT" -o short-monotonic --no-pager -n 80 2>&1 || true
	echo "---- /proc/swaps; free -m ----"
	cat /proc/swaps
	free -m
}

prop() { systemctl show -P "$1" "$UNIT"; }
# The kernel device's name (nbdN or ublkbN), the kernel's word for its
# driver in the log (KLOG), and what gzramd logs when a stop takes it
# away (DETACHED): NBD's is detached from its export, ublk's removed.
case "$transport" in
nbd) KDEV='nbd[0-9]+' KLOG=nbd DETACHED='kernel device detached' ;;
ublk) KDEV='ublkb[0-9]+' KLOG=ublk DETACHED='kernel device removed' ;;
*) result "FAIL boot: e2e.transport=$transport is neither nbd nor ublk" ;;
esac
# kdev_swap: the kernel device (nbdN or ublkbN) that is active swap, if
# any (the guest has no other swap).
# /proc/swaps names it as seen from the mount namespace that turned it on:
# once that (a unit's) is gone, "/nbd0" stands for /dev/nbd0.
kdev_swap() { awk -v re="^(/dev)?/$KDEV\$" 'NR > 1 && $1 ~ re { sub("^(/dev)?/", "/dev/", $1); print $1; exit }' /proc/swaps; }
# klog_lines: how many lines of the kernel log name the device's driver.
klog_lines() { dmesg | grep -c "$KLOG" || true; }
vmstat_get() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }
# now_us: CLOCK_MONOTONIC in µs, the clock of systemd's *Monotonic
# timestamps (/proc/uptime counts suspend too; this guest never suspends).
now_us() { awk '{ printf "%d\n", $1 * 1000000 }' /proc/uptime; }
# seconds SPAN: systemd's time span ("30s", "1min 30s") in seconds.
seconds() {
	local s=0 part
	for part in $1; do
		case "$part" in
		*min) s=$((s + ${part%min} * 60)) ;;
		*ms) ;;
		*s) s=$((s + ${part%s})) ;;
		*) return 1 ;;
		esac
	done
	echo "$s"
}
# gz_log INVOCATION: what gzramd wrote (its stderr) in one run of the unit.
# journalctl --sync first: journald may not have read the last lines yet.
gz_log() {
	journalctl --sync
	journalctl -q -o cat --no-pager _SYSTEMD_INVOCATION_ID="$1"
}
# gz_log_wait INVOCATION PATTERN: waits (10 s at most) for PATTERN in
# gz_log. (Never `gz_log | grep -q`: grep's early exit would fail the
# pipeline, under pipefail.)
gz_log_wait() {
	local i log
	for i in $(seq 20); do
		log=$(gz_log "$1")
		grep -q -- "$2" <<<"$log" && return 0
		sleep 0.5
	done
	return 1
}
# owner DEV: the process that serves the kernel device, or "none".
# NBD: the one that connected /dev/nbdN; the kernel records the thread that
# made the connection (a Go thread of gzramd's, not its main thread): its
# thread group is the process. ublk records no server in sysfs: the
# process that has /dev/ublkbN's char device, /dev/ublkcN, open (only the
# serving process opens it; the driver lets one at a time).
owner() {
	local tid fd
	if [ "$transport" = ublk ]; then
		fd=$(find /proc/[0-9]*/fd -lname "/dev/ublkc${1#/dev/ublkb}" -print -quit 2>/dev/null || true)
		[ -n "$fd" ] || {
			echo none
			return
		}
		fd=${fd#/proc/}
		echo "${fd%%/*}"
		return
	fi
	tid=$(cat "/sys/block/${1#/dev/}/pid" 2>/dev/null) || {
		echo none
		return
	}
	awk '$1 == "Tgid:" { print $2 }' "/proc/$tid/status" 2>/dev/null || echo "gone:$tid"
}
# gone DEV: the stop took the kernel device away: NBD's is disconnected
# (no pid), ublk's deleted (no /sys/block/ublkbN) and no process has its
# char device open.
gone() {
	[ "$(owner "$1")" = none ] || return 1
	[ "$transport" = nbd ] || [ ! -e "/sys/block/${1#/dev/}" ]
}
# gz_count INVOCATION PATTERN: how many of gzramd's lines in the unit's
# run match.
gz_count() { gz_log "$1" | grep -c -- "$2" || true; }

# ppid PID: the parent of process PID.
ppid() { awk '$1 == "PPid:" { print $2 }' "/proc/$1/status" 2>/dev/null; }
# serving_pid: the serving process, the child of gzramd's supervisor (the
# unit's main process).
# (awk reads to the end, where `| head -1` could kill pgrep with SIGPIPE;
# no child at all is an empty answer, not a failed pipeline under
# pipefail and set -e.)
serving_pid() { { pgrep -P "$(prop MainPID)" || true; } | awk 'NR == 1'; }
# gz_log_wait_for SECONDS INVOCATION PATTERN: gz_log_wait with a limit.
gz_log_wait_for() {
	local i log
	for i in $(seq $(($1 * 2))); do
		log=$(gz_log "$2")
		grep -q -- "$3" <<<"$log" && return 0
		sleep 0.5
	done
	return 1
}
# io_errors: what the kernel logged this boot about failed block or swap
# I/O (the nbd driver's own lines about dead connections are expected
# while no server runs).
io_errors() { dmesg | grep -E 'I/O error|Read-error on swap|Write-error on swap|Buffer I/O' || true; }

check_install() {
	local f path mode version
	for f in /usr/local/bin/gzramd:755 /etc/systemd/system/gzramd.service:644 /etc/gzramd/gzramd.env:644; do
		path=${f%:*} mode=${f#*:}
		[ "$(stat -c %a "$path" 2>/dev/null)" = "$mode" ] || fail "install: $path missing or not mode $mode"
	done
	grep -qx 'GZRAMD_SWAP=true' /etc/gzramd/gzramd.env || fail "install: the env file does not say GZRAMD_SWAP=true"
	# nbd: the env file as installed (no transport: the default);
	# ublk: its commented GZRAMD_TRANSPORT=ublk line taken in.
	if [ "$transport" = nbd ]; then
		! grep -q '^GZRAMD_TRANSPORT=' /etc/gzramd/gzramd.env || fail "install: the env file sets $(grep '^GZRAMD_TRANSPORT=' /etc/gzramd/gzramd.env)"
	else
		grep -qx "GZRAMD_TRANSPORT=$transport" /etc/gzramd/gzramd.env || fail "install: the env file does not say GZRAMD_TRANSPORT=$transport"
	fi
	[ -z "$(kdev_swap)" ] || fail "install: a $KLOG device is swap before gzramd was started"
	version=$(/usr/local/bin/gzramd version 2>&1)
	pass "install: make install's files in place, transport $transport (${version%%$'\n'*}; kernel $(uname -r))"
}

# The README's next two steps. `systemctl enable --now` returns when the
# start job is done, which for Type=notify is once the daemon sent READY=1:
# swap must be on at that moment, not some time after.
check_start() {
	local t0=$SECONDS swaps state dev pid status
	systemctl daemon-reload
	systemctl enable --now "$UNIT" || fail "start: systemctl enable --now gzramd failed (Result=$(prop Result))"
	swaps=$(swapon --show=NAME --noheadings)
	state=$(prop ActiveState)
	dev=$(kdev_swap)
	[ "$state" = active ] || fail "start: systemctl enable --now returned with the unit $state"
	[ -n "$dev" ] || fail "start: the unit is active but no $KLOG device is swap yet (swapon --show: '${swaps:-nothing}'): READY came before swapon"
	# The supervisor (MainPID) runs the serving process, which connects
	# (NBD) or serves (ublk) the device.
	pid=$(prop MainPID)
	[ "$(ppid "$(owner "$dev")")" = "$pid" ] || fail "start: $dev is swap but its server is pid $(owner "$dev"), not the serving process under gzramd's supervisor $pid"
	gz_log_wait "$(prop InvocationID)" "msg=\"gzramd ready\".* transport=$transport " ||
		fail "start: gzramd did not log 'gzramd ready' with transport=$transport"
	status=$(prop StatusText)
	[ "$status" = "serving gzram0" ] || fail "start: STATUS is '$status', not what gzramd's READY=1 sends"
	[ "$(systemctl is-enabled "$UNIT")" = enabled ] || fail "start: the unit is not enabled"
	DEV=$dev
	pass "start: enable --now returned after $((SECONDS - t0)) s with the unit active, STATUS '$status', and $dev already swap (swapon --show: $(echo $swaps))"
}

# Every hardening step (mlockall, SCHED_RR, IO flusher, oom_score_adj)
# must succeed inside the unit's sandbox and capability set: gzramd logs
# a failed step as a warning and carries on, so only the log tells.
check_hardening() {
	local inv log bad
	inv=$(prop InvocationID)
	gz_log_wait "$inv" 'msg="gzramd ready"' || fail "hardening: no 'gzramd ready' in the unit's log"
	log=$(gz_log "$inv")
	bad=$(grep -E 'level=(WARN|ERROR)' <<<"$log" || true)
	[ -z "$bad" ] || fail "hardening: gzramd warned while starting under systemd: $(head -3 <<<"$bad")"
	grep -q 'msg=hardening step=' <<<"$log" || fail "hardening: gzramd logged no hardening steps"
	pass "hardening: $(grep -c 'msg=hardening step=' <<<"$log") steps done, no warnings ($(grep -o 'step=[a-z_-]*' <<<"$log" | sort -u | tr '\n' ' '))"
}

# While the hog runs, note every WatchdogTimestamp systemd shows: it
# moves each time gzramd's WATCHDOG=1 arrives.
watchdog_sampler() {
	while :; do
		prop WatchdogTimestampMonotonic >>"$RUN/watchdog" || true
		sleep 5
	done
}

check_hog() {
	local out0 in0 rc=0 out in peak
	out0=$(vmstat_get pswpout) in0=$(vmstat_get pswpin)
	step "hog $hog_mib MiB seed $seed ($(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB of RAM)"
	free -m
	# At the hog's peak most of it is in swap: see how much, and what
	# `gzramd status` says then.
	HOG_PEAK_CMD="cat /proc/swaps >$RUN/peak.swaps; /usr/local/bin/gzramd status >$RUN/peak.status 2>&1" \
		"$LIB/hog" "$hog_mib" "$seed" || rc=$?
	out=$(($(vmstat_get pswpout) - out0)) in=$(($(vmstat_get pswpin) - in0))
	echo "E2E-SWAP pswpout=$out pswpin=$in"
	cat "$RUN/peak.status" 2>/dev/null || true
	[ "$rc" -eq 0 ] || fail "hog: the hog found wrong data or died (exit $rc)"
	[ "$out" -gt 0 ] || fail "hog: the hog never swapped out (pswpout did not grow): the test proved nothing"
	peak=$(awk -v d="$DEV" '$1 == d { print $4 }' "$RUN/peak.swaps" 2>/dev/null)
	[ "${peak:-0}" -gt 0 ] || fail "hog: nothing was in $DEV at the hog's peak"
	pass "hog: $hog_mib MiB written and verified twice; $out pages swapped out and $in in, $((peak >> 10)) MiB in $DEV at the peak"
}

# systemd saw pings for several watchdog periods, the last one recent, and
# never timed the watchdog out (which would send SIGUSR1: gzramd then logs
# its goroutines).
check_watchdog() {
	local wd_s enter left pings last inv log journal
	wd_s=$(seconds "$(prop WatchdogUSec)") || fail "watchdog: WatchdogUSec is '$(prop WatchdogUSec)'"
	[ "$wd_s" -gt 0 ] || fail "watchdog: the unit has no watchdog (WatchdogUSec=$(prop WatchdogUSec))"
	# Alive for three periods at least, sampling meanwhile.
	enter=$(prop ActiveEnterTimestampMonotonic)
	left=$(((enter + 3 * wd_s * 1000000 - $(now_us)) / 1000000 + 1))
	if [ "$left" -gt 0 ]; then
		step "watchdog: waiting $left s more, to see three periods of ${wd_s} s"
		sleep "$left"
	fi
	prop WatchdogTimestampMonotonic >>"$RUN/watchdog"
	# A missed ping makes systemd count the unit failed: it leaves
	# "active" for "deactivating (stop-watchdog)" with Result=watchdog.
	[ "$(prop ActiveState)" = active ] && [ "$(prop Result)" = success ] ||
		fail "watchdog: the unit is $(prop ActiveState) ($(prop SubState)), Result=$(prop Result)"
	pings=$(grep -v '^0$' "$RUN/watchdog" | sort -u | wc -l)
	last=$(prop WatchdogTimestampMonotonic)
	[ "$pings" -ge 3 ] || fail "watchdog: systemd's WatchdogTimestamp took $pings values over $((($(now_us) - enter) / 1000000)) s"
	[ $(($(now_us) - last)) -lt $((wd_s * 1000000)) ] || fail "watchdog: the last ping was $((($(now_us) - last) / 1000000)) s ago, over WatchdogSec=${wd_s}s"
	inv=$(prop InvocationID)
	log=$(gz_log "$inv")
	grep -q 'msg="systemd watchdog on"' <<<"$log" || fail "watchdog: gzramd did not see the watchdog (no 'systemd watchdog on')"
	! grep -qE 'SIGUSR1|health check failed' <<<"$log" || fail "watchdog: $(grep -m1 -E 'SIGUSR1|health check failed' <<<"$log")"
	journal=$(journalctl -q -b -u "$UNIT" --no-pager)
	! grep -qi 'watchdog timeout' <<<"$journal" || fail "watchdog: systemd logged a watchdog timeout"
	pass "watchdog: WatchdogSec=${wd_s}s, $pings distinct WatchdogTimestamps over $((($(now_us) - enter) / 1000000)) s active, last ping $((($(now_us) - last) / 1000000)) s ago, no timeout"
}

# `systemctl stop` waits for the daemon to exit: by then swap must be off,
# the device detached, and the exit clean.
check_stop() {
	local inv pid t0=$SECONDS state result code status swaps log
	inv=$(prop InvocationID) pid=$(prop MainPID)
	systemctl stop "$UNIT" || fail "stop: systemctl stop failed"
	state=$(prop ActiveState) result=$(prop Result) code=$(prop ExecMainCode) status=$(prop ExecMainStatus)
	swaps=$(swapon --show --noheadings)
	[ -z "$swaps" ] || fail "stop: swap still on after systemctl stop: $swaps"
	[ "$state" = inactive ] && [ "$result" = success ] || fail "stop: the unit is $state, Result=$result"
	# ExecMainCode 1 is CLD_EXITED: an exit, not a signal.
	[ "$code" = 1 ] && [ "$status" = 0 ] || fail "stop: gzramd ended with code $code status $status, not exit 0"
	! kill -0 "$pid" 2>/dev/null || fail "stop: gzramd (pid $pid) still runs"
	gone "$DEV" || fail "stop: $DEV is still there (served by $(owner "$DEV"))"
	gz_log_wait "$inv" 'msg=stopped' || fail "stop: gzramd did not log 'stopped'"
	log=$(gz_log "$inv")
	grep -q 'msg="swap off"' <<<"$log" || fail "stop: gzramd did not log 'swap off'"
	grep -q "msg=\"$DETACHED\"" <<<"$log" || fail "stop: gzramd did not log '$DETACHED'"
	pass "stop: systemctl stop took $((SECONDS - t0)) s; exit status 0, swapon --show empty, $DEV gone; gzramd logged: $(grep -oE "msg=\"(turning swap off[^\"]*|swap off|$DETACHED)\"|msg=stopped" <<<"$log" | tr '\n' ' ')"
}

check_restart() {
	systemctl start "$UNIT" || fail "restart: systemctl start failed"
	DEV=$(kdev_swap)
	[ -n "$DEV" ] || fail "restart: active, but no swap"
	pass "restart: systemctl start made $DEV swap again"
}

# A reboot with data in gzramd's swap: a holder (the hog with HOG_HOLD)
# in a unit that systemd stops only after gzramd (Before=gzramd.service:
# stop order is the reverse), its pages pushed out to swap by a second
# hog. At the reboot gzramd's swapoff must read them back, and the holder
# checks them when it is stopped (check_shutdown reads its verdict).
check_hold() {
	local i log pid swapped used
	systemd-run --quiet --unit=gzramd-e2e-hold --property=Before="$UNIT" --setenv=HOG_HOLD=1 \
		"$LIB/hog" "$hold_mib" "$((seed + 1))"
	for i in $(seq 120); do
		log=$(journalctl -q -o cat -u gzramd-e2e-hold)
		grep -q HOG-HOLDING <<<"$log" && break
		sleep 1
	done
	grep -q HOG-HOLDING <<<"$log" || fail "hold: the holder did not write its $hold_mib MiB in 120 s"
	step "hold: pushing the holder's pages out with a $push_mib MiB hog"
	"$LIB/hog" "$push_mib" "$((seed + 2))" >"$RUN/push.log" || {
		cat "$RUN/push.log"
		fail "hold: the $push_mib MiB hog failed"
	}
	pid=$(systemctl show -P MainPID gzramd-e2e-hold)
	swapped=$(awk '$1 == "VmSwap:" { print int($2 / 1024) }' "/proc/$pid/status")
	used=$(awk -v d="$DEV" '$1 == d { print int($4 / 1024) }' /proc/swaps)
	[ "$swapped" -ge $((hold_mib / 4)) ] || fail "hold: only $swapped MiB of the holder's $hold_mib MiB are in swap"
	pass "hold: $swapped MiB of the holder's $hold_mib MiB in swap, $used MiB of $DEV used, before the reboot"
}

# An upgrade with the holder's pages in swap: `systemctl reload` makes the
# serving process hand the kernel device to a new one (the binary at the
# unit's path, the same here), which takes the data over. NBD: the live
# connections, passed at a request boundary; ublk: the device, left with
# the requests in hand answered and recovered by the next (ublk user
# recovery; the driver holds what comes meanwhile). The kernel must see
# nothing: no line of the driver's, the same device swap, the unit active
# all along under the same supervisor.
check_reload() {
	local main inv serving before after log kept
	main=$(prop MainPID) inv=$(prop InvocationID) serving=$(serving_pid)
	before=$(klog_lines)
	kept='msg="kernel device kept its connections'
	[ "$transport" = nbd ] || kept='msg="kernel device taken over: .* transport=ublk '
	systemctl reload "$UNIT" || fail "reload: systemctl reload failed"
	gz_log_wait_for 60 "$inv" "$kept" ||
		fail "reload: no serving process took the kernel device over within 60 s"
	log=$(gz_log "$inv")
	grep -q 'msg="took the device over from the serving process before this one, which handed it over' <<<"$log" ||
		fail "reload: the next serving process did not take the data over as an upgrade"
	[ "$transport" = nbd ] || grep -q 'msg="ublk device left to the next serving process"' <<<"$log" ||
		fail "reload: the serving process did not leave the ublk device to the next"
	after=$(klog_lines)
	[ "$after" = "$before" ] || fail "reload: the kernel logged about its $KLOG device: $(dmesg | grep "$KLOG" | tail -n $((after - before)) | head -3)"
	[ "$(prop MainPID)" = "$main" ] && [ "$(prop ActiveState)" = active ] ||
		fail "reload: the unit is $(prop ActiveState) with MainPID $(prop MainPID) (was $main)"
	[ "$(serving_pid)" != "$serving" ] || fail "reload: still the serving process $serving"
	# (NBD's sysfs pid stays the thread that first connected, gone now.)
	[ "$transport" = nbd ] || [ "$(ppid "$(owner "$DEV")")" = "$main" ] || fail "reload: $DEV is served by $(owner "$DEV"), not the new serving process"
	[ "$(kdev_swap)" = "$DEV" ] || fail "reload: $DEV is no longer swap"
	pass "reload: the serving process $serving handed over to $(serving_pid) ($(grep -o 'msg="handed over[^"]*" took=[^ ]*' <<<"$log" | tail -1 | sed 's/.*took=//')); no $KLOG line in the kernel log, $DEV still swap"
}

# Crashes with the holder's pages in swap: the serving process killed
# (the supervisor starts another, which takes the data and the kernel
# device over), then the supervisor itself (systemd's Restart= starts a
# new one, which gets the data back from the file descriptor store). The
# same device stays swap throughout, the kernel logs no I/O error, and the
# holder verifies its pages at the reboot (check_shutdown).
check_crash() {
	local main inv serving log pause1 t0 i before after errs new_errs
	main=$(prop MainPID) inv=$(prop InvocationID)
	serving=$(serving_pid)
	[ -n "$serving" ] || fail "crash: no serving process under gzramd's supervisor $main"
	step "crash: SIGKILL the serving process $serving (supervisor $main)"
	# The reload before took over too: count this one's lines.
	# (Over ublk the upgrade's takeover logs 'kernel device taken over'
	# too: count this one's.)
	local n0 k0
	n0=$(gz_count "$inv" 'msg="serving again after the takeover"')
	k0=$(gz_count "$inv" 'msg="kernel device taken over')
	kill -KILL "$serving"
	for i in $(seq 120); do
		[ "$(gz_count "$inv" 'msg="serving again after the takeover"')" -gt "$n0" ] && break
		sleep 0.5
	done
	[ "$(gz_count "$inv" 'msg="serving again after the takeover"')" -gt "$n0" ] ||
		fail "crash: no serving process took over within 60 s of the kill"
	log=$(gz_log "$inv")
	[ "$(grep -c 'msg="kernel device taken over' <<<"$log")" -gt "$k0" ] || fail "crash: the next serving process did not take the kernel device over"
	[ "$(prop MainPID)" = "$main" ] && [ "$(prop ActiveState)" = active ] ||
		fail "crash: the unit is $(prop ActiveState) with MainPID $(prop MainPID) after the serving process died (was $main)"
	[ "$transport" = nbd ] || [ "$(ppid "$(owner "$DEV")")" = "$main" ] || fail "crash: $DEV is served by $(owner "$DEV"), not the next serving process"
	[ "$(kdev_swap)" = "$DEV" ] || fail "crash: $DEV is no longer swap after the takeover"
	pause1=$(grep -o 'msg="serving again after the takeover" pause=[^ ]*' <<<"$log" | tail -1 | sed 's/.*pause=//')
	pass "crash: the serving process killed; serving process $(serving_pid) took over under the same supervisor after $pause1, $DEV still swap"

	step "crash: SIGKILL the supervisor $main"
	t0=$SECONDS
	serving=$(serving_pid)
	before=$(klog_lines)
	# This boot's earlier errors are not this check's: a stop's detach
	# leaves the kernel's partition scan reading a disconnected device.
	errs=$(io_errors | wc -l)
	kill -KILL "$main"
	for i in $(seq 240); do
		[ "$(prop MainPID)" != "$main" ] && [ "$(prop MainPID)" != 0 ] && [ "$(prop ActiveState)" = active ] && break
		sleep 0.5
	done
	[ "$(prop ActiveState)" = active ] && [ "$(prop MainPID)" != "$main" ] ||
		fail "crash-supervisor: after the supervisor's death the unit is $(prop ActiveState) ($(prop SubState)), MainPID $(prop MainPID)"
	inv=$(prop InvocationID)
	gz_log_wait_for 60 "$inv" 'msg="gzramd ready"' || fail "crash-supervisor: the restarted unit's serving process did not become ready"
	log=$(gz_log "$inv")
	# The serving process served on (an orphan) while systemd started the
	# unit again, then handed its connections to the new serving process.
	grep -q 'msg="state handed back by systemd' <<<"$log" || fail "crash-supervisor: the restarted supervisor did not get the state from systemd's file descriptor store"
	grep -q 'msg="the orphaned serving process handed over and exited"' <<<"$log" ||
		fail "crash-supervisor: the new serving process did not take over from the old one, which served on"
	grep -q 'msg="took the device over from a serving process' <<<"$log" || fail "crash-supervisor: the restarted unit started with an empty device"
	# NBD: the orphan's connections passed to the new serving process;
	# ublk: the device it left, recovered by the new one.
	if [ "$transport" = nbd ]; then
		grep -q 'msg="kernel device kept its connections' <<<"$log" || fail "crash-supervisor: the kernel device's connections were not handed over"
	else
		grep -q 'msg="kernel device taken over: .* transport=ublk ' <<<"$log" || fail "crash-supervisor: the new serving process did not take the ublk device over"
	fi
	! kill -0 "$serving" 2>/dev/null || fail "crash-supervisor: the old serving process $serving still runs"
	[ "$transport" = nbd ] || [ "$(ppid "$(owner "$DEV")")" = "$(prop MainPID)" ] || fail "crash-supervisor: $DEV is served by $(owner "$DEV"), not the new serving process"
	[ "$(kdev_swap)" = "$DEV" ] || fail "crash-supervisor: $DEV is no longer swap after the restart"
	new_errs=$(io_errors | tail -n +$((errs + 1)))
	[ -z "$new_errs" ] || fail "crash-supervisor: the kernel logged I/O errors: $(head -3 <<<"$new_errs")"
	after=$(klog_lines)
	[ "$after" = "$before" ] || fail "crash-supervisor: the kernel logged about its $KLOG device: $(dmesg | grep "$KLOG" | tail -n $((after - before)) | head -3)"
	pass "crash-supervisor: the supervisor killed; its serving process $serving served on while systemd restarted the unit (supervisor $(prop MainPID), active in $((SECONDS - t0)) s), then handed $DEV to the new serving process $(serving_pid), which took the state from the file descriptor store; no $KLOG or I/O error line in the kernel log; $(swapon --show=NAME,USED --noheadings)"
}

boot1() {
	step "boot 1: gzramd installed by make install; the README's systemctl steps"
	check_install
	check_start
	check_hardening
	watchdog_sampler &
	local sampler=$!
	check_hog
	check_watchdog
	kill "$sampler"
	check_stop
	check_restart
	check_hold
	check_reload
	check_crash
	echo 1 >"$STATE/boot"
	sync
	step "rebooting: systemctl reboot, with gzramd serving swap"
	rebooting=1
	systemctl reboot
}

# Boot 2: nothing here starts gzramd; the boot did, because it is enabled.
check_reboot() {
	local i state me enter dev swaps
	[ "$(systemctl is-enabled "$UNIT" 2>&1)" = enabled ] || fail "reboot: the unit is $(systemctl is-enabled "$UNIT" 2>&1), not enabled"
	for i in $(seq 300); do
		state=$(prop ActiveState)
		[ "$state" = activating ] || break
		sleep 1
	done
	[ "$state" = active ] || fail "reboot: the unit is $state after boot"
	dev=$(kdev_swap)
	[ -n "$dev" ] || fail "reboot: the unit is active but no $KLOG device is swap"
	[ "$(ppid "$(owner "$dev")")" = "$(prop MainPID)" ] || fail "reboot: $dev is not gzramd's"
	me=$(systemctl show -P ExecMainStartTimestampMonotonic gzramd-e2e.service)
	enter=$(prop ActiveEnterTimestampMonotonic)
	[ "$enter" -lt "$me" ] || fail "reboot: gzramd became active after these checks started"
	swaps=$(swapon --show --noheadings)
	pass "reboot: the enabled unit was active with $dev swap $(((me - enter) / 1000000)) s before the checks started (swapon --show: $(echo $swaps))"
}

# How boot 1's shutdown went for gzramd: the journal of its last run
# then, and the holder's verdict, which must come after gzramd stopped.
check_shutdown() {
	local log used both
	log=$(journalctl -q -b -1 -u "$UNIT" -o cat --no-pager | awk '/msg="gzramd ready"/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }')
	[ -n "$log" ] || fail "shutdown: no journal of boot 1"
	grep -q 'msg="swap off"' <<<"$log" || fail "shutdown: gzramd did not log 'swap off' when boot 1 shut down"
	grep -q "msg=\"$DETACHED\"" <<<"$log" || fail "shutdown: no '$DETACHED' at boot 1's shutdown"
	grep -q 'msg=stopped' <<<"$log" || fail "shutdown: no 'stopped' at boot 1's shutdown"
	! grep -qE 'refusing to stop|Failed with result|level=ERROR' <<<"$log" || fail "shutdown: $(grep -m1 -E 'refusing to stop|Failed with result|level=ERROR' <<<"$log")"
	# systemd 248 and later say "Deactivated successfully", 247 "Succeeded".
	grep -qE 'Deactivated successfully|Succeeded\.' <<<"$log" || fail "shutdown: systemd did not log that boot 1's last run ended successfully"
	used=$({ grep -m1 -o 'msg="turning swap off[^"]*" device=[^ ]* used_bytes=[0-9]*' <<<"$log" || true; } | sed 's/.*used_bytes=//')
	[ "${used:-0}" -gt 0 ] || fail "shutdown: gzramd's swap was empty at the reboot: the holder's data never was in it"
	both=$(journalctl -q -b -1 -u "$UNIT" -u gzramd-e2e-hold -o cat --no-pager)
	grep -q '^HOG-PASS' <<<"$both" || fail "shutdown: the holder did not verify its data at the reboot: $(grep -E '^(HOG-|hog: )' <<<"$both" | tail -3)"
	awk '/msg=stopped/ { stopped = NR } /^hog: SIGTERM/ { term = NR } END { exit !(stopped && term > stopped) }' <<<"$both" ||
		fail "shutdown: the holder was stopped before gzramd was"
	pass "shutdown: at systemctl reboot gzramd turned swap off with $((used >> 20)) MiB in it, detached and exited 0, then the holder verified its $hold_mib MiB; gzramd logged: $(grep -oE "msg=\"(swap off|$DETACHED)\"|msg=stopped|Deactivated successfully|Succeeded\\." <<<"$log" | tr '\n' ' ')"
}

boot2() {
	step "boot 2: after systemctl reboot"
	check_reboot
	check_shutdown
	echo 2 >"$STATE/boot"
	result PASS
}

case "$(cat "$STATE/boot" 2>/dev/null || echo 0)" in
0) boot1 ;;
1) boot2 ;;
*) fail "boot: a third boot; boot 2 should have powered off" ;;
esac
