#!/bin/busybox sh
# /init of the e2e guest. Parameters come on the kernel command line as
# e2e.NAME=VALUE; the host reads the console for the lines starting with
# E2E- (E2E-RESULT: PASS|FAIL is the verdict).
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64

mode=client port=10809 export=gzram0 conns=1 hog=200 seed=1 random=8 kconns=1 minfree=16384 size=512MiB host=10.0.2.2 metrics=
# survive: at least `kills` SIGKILLs of the serving process (at most
# `maxkills`), each `kmin`..`kmax` seconds after that process started;
# every `early`-th one during its takeover instead: 0..`earlymax` seconds
# after it took the state over (its gzramd-heaplock thread runs), before it
# serves again.
kills=20 maxkills=40 kmin=3 kmax=12 early=5 earlymax=0.2
# survive: at least `upgrades` planned upgrades (systemctl reload's
# SIGHUP), before kill 1 and every `upgrade_every` kills after, each once
# the serving process has served `quiet` seconds (killer.c).
upgrades=0 upgrade_every=0 quiet=13
# daemon, survive: 1 runs gzramd in a cgroup with memory.swap.max=0.
swapmax0=0
# daemon, survive: NAME=VALUE[,NAME=VALUE...] in gzramd's environment (a
# faults build's GZRAMD_FAULT_* switches: run.sh's survive-mutant).
daemon_env=
# client: a directory with ca-cert.pem, client-cert.pem and client-key.pem
# makes nbd-client connect over TLS with them (run.sh's host-tls).
# tlsguard: what guards nbd-client, and so the TLS proxy it forks, comma-
# separated: flusher (an IO flusher, real-time: ioflusher.c), cgroup (in a
# cgroup with memory.swap.max=0); run.sh adds a ramfs root for ramfs.
tls= tlsguard=
# daemon: the kernel device's transport, gzramd serve --transport: nbd
# (--device /dev/nbd0) or ublk (a /dev/ublkbN gzramd creates, without the
# supervisor: run.sh's guest-ublk).
transport=nbd
# ublk: -test.run of pkg/ublk's tests, the reads TestQD1ReadLatency times,
# TestSwap's hog (MiB; none: TestSwap does not run).
ublk_run= ublk_reads= ublk_hog=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	e2e.*=*) kv=${arg#e2e.}; eval "${kv%%=*}='${kv#*=}'" ;;
	esac
done

result() {
	echo "E2E-RESULT: $*"
	sync
	poweroff -f
	sleep 60
}
step() { echo "E2E-STEP: $*"; }
fail() { result "FAIL $*"; }
vmstat_get() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }
# io_flushers PID...: "F T": of the T threads of these processes, F carry
# PF_MEMALLOC_NOIO|PF_LOCAL_THROTTLE (0x180000, set by PR_SET_IO_FLUSHER)
# in their stat flags (field 9, the 7th after the command's last ')').
io_flushers() {
	for p; do ls /proc/"$p"/task/*/stat; done 2>/dev/null |
		xargs awk '{ sub(/.*\) /, ""); t++; if (and($7, 1572864) == 1572864) f++ } END { print f + 0, t + 0 }' 2>/dev/null
}
# stop_gzramd: SIGTERM to the supervisor, and up to 120 s for it and its
# serving process to stop; 1 if they did not. At 60 s every thread's kernel
# stack goes to the console (and sysrq w), to show where a stop hangs.
stop_gzramd() {
	local i=0 p t procs
	kill -TERM "$daemon_pid"
	while kill -0 "$daemon_pid" 2>/dev/null; do
		i=$((i + 1))
		[ "$i" -gt 240 ] && return 1
		if [ "$i" = 120 ]; then
			procs=$(gzramd_processes)
			echo "E2E-STEP: gzramd still running 60 s after SIGTERM: the kernel stacks of its threads ($procs)"
			for p in $procs; do
				for t in /proc/"$p"/task/*; do
					echo "E2E-STACK $p/${t##*/} $(cat "$t"/comm 2>/dev/null) state $(awk '{ print $3 }' "$t"/stat 2>/dev/null) wchan $(cat "$t"/wchan 2>/dev/null)"
					sed 's/^/E2E-STACK   /' "$t"/stack 2>/dev/null
				done
			done
			echo w >/proc/sysrq-trigger 2>/dev/null
		fi
		sleep 0.5
	done
	return 0
}
# gzramd_processes: the supervisor and its children (serving, standby).
gzramd_processes() { echo "$daemon_pid" $(cat /proc/"$daemon_pid"/task/*/children 2>/dev/null); }
# tls_proxies WHEN: nbd-client's TLS proxies (the processes it forks, one per
# connection, that encrypt between the kernel's socket and the server's)
# as E2E-TLS lines: their memory, locked and swapped out.
tls_proxies() {
	local p n=0
	for p in $(pidof nbd-client); do
		n=$((n + 1))
		echo "E2E-TLS $1 proxy pid=$p $(awk '/^(VmRSS|VmLck|VmSwap):/ { printf "%s%s%s ", $1, $2, $3 }' /proc/"$p"/status 2>/dev/null)io_flusher_threads=$(io_flushers "$p" | tr ' ' /) policy=$(awk '{ print $41 }' /proc/"$p"/stat 2>/dev/null) cgroup=$(cat /proc/"$p"/cgroup 2>/dev/null)"
	done
	echo "E2E-TLS $1 proxies=$n"
}
# scrape WHEN: gzramd's metrics (no histogram buckets) as E2E-METRIC lines.
scrape() {
	[ -n "$metrics" ] || return 0
	httpget "$metrics" /metrics >/tmp/metrics || echo "E2E-STEP: scraping $metrics failed"
	grep '^gzramd_' /tmp/metrics | grep -v '_bucket{' | sed "s/^/E2E-METRIC $1 /"
	rm -f /tmp/metrics
}

if [ "$mode" = probe ]; then
	echo "E2E-PROBE-OK"
	poweroff -f
fi

step "loading modules"
while read -r mod; do
	insmod "$mod" || fail "insmod $mod"
done </etc/e2e-modules

# ublk: pkg/ublk's tests (go test -c, /bin/ublk.test) serve a device from
# memory through ublk_drv and write, read, discard and time it, and (with
# ublk_hog) swap to it while the hog runs; the tests that need the driver
# must run, not skip.
# prefix_to FILE: stdin to the console and FILE, each line as it comes
# (sed into a pipe would hold its lines back) as "E2E-UBLK line".
prefix_to() {
	awk -v f="$1" '{ l = "E2E-UBLK " $0; print l; print l >>f; fflush() }'
}
if [ "$mode" = ublk ]; then
	[ -s /etc/e2e-modules-ublk ] || fail "kernel $(uname -r) has no ublk_drv module (E2E_KERNEL_META=linux-image-6.12-amd64)"
	while read -r mod; do
		insmod "$mod" || fail "insmod $mod"
	done </etc/e2e-modules-ublk
	[ -c /dev/ublk-control ] || fail "no /dev/ublk-control after loading ublk_drv"
	sysctl -w vm.min_free_kbytes="$minfree" >/dev/null || fail "sysctl vm.min_free_kbytes=$minfree"
	step "ublk: ublk.test -test.run '${ublk_run:-.}' (kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { print $2 }' /proc/meminfo) kB)"
	UBLK_LATENCY_READS=${ublk_reads:-2000} /bin/ublk.test -test.v -test.count=1 -test.run "${ublk_run:-.}" \
		-test.skip 'TestSwap|TestProbeNoPermission' \
		-test.timeout 300s 2>&1 | prefix_to /tmp/ublk.out
	grep -q '^E2E-UBLK PASS$' /tmp/ublk.out || fail "ublk.test failed"
	# Every test must run here but TestProbeNoPermission, which is an
	# ordinary user's (the guest runs as root) and left out above.
	grep -q -- '--- SKIP' /tmp/ublk.out && fail "ublk.test skipped a test in the guest"
	# (Unless e2e.ublk_run picked some.)
	[ -n "$ublk_run" ] || grep -q -- '--- PASS: TestBlockDevice' /tmp/ublk.out || fail "TestBlockDevice did not pass"
	if [ -n "$ublk_hog" ]; then
		# A process of its own: it locks its memory, which would lock
		# the heaps the tests before it left too. GODEBUG as gzramd sets
		# it for itself (pkg/ublk's doc, Serving swap): a garbage
		# collection that shrank a queue's stack would have the next
		# request grow it, allocating while it serves swap. (The CI run
		# that hung here on 2026-12-06, the hog and kswapd in D, was the
		# queue thread's signal stack faulting: pkg/ublk's
		# signalStackResident.) asyncpreemptoff: the test's backend
		# compresses in Go (gzramd's codecs are C), long enough for the
		# runtime to preempt a queue's goroutine, and Go 1.26 saves its
		# vector registers in a block it allocates off the heap
		# (runtime.xRegSave): its first write to a fresh page faulted,
		# into reclaim that waited on the device (a hang, 1 run in 10).
		step "ublk: TestSwap: hog $ublk_hog MiB"
		GODEBUG=gcshrinkstackoff=1,asyncpreemptoff=1 UBLK_SWAP_HOG_MIB=$ublk_hog /bin/ublk.test -test.v -test.count=1 -test.run TestSwap -test.timeout 500s 2>&1 |
			prefix_to /tmp/ublk-swap.out
		grep -q -- '--- PASS: TestSwap' /tmp/ublk-swap.out || fail "TestSwap did not pass"
		grep -q '^E2E-UBLK HOG-PASS' /tmp/ublk-swap.out || fail "the hog did not pass"
	fi
	result PASS
fi

# transports: bench/transports.sh's comparison of the kernel's block
# devices (issue 38): zram, gzramd over the kernel's NBD client and over
# ublk, measured by /bin/transports-guest (bench/transports-guest.sh, in
# the archive the bench appends, with fio, zram's modules and gzramd).
if [ "$mode" = transports ]; then
	for list in /etc/e2e-modules-ublk /etc/e2e-modules-zram; do
		[ -s "$list" ] || fail "kernel $(uname -r): no modules in $list (bench/transports.sh wants 6.12)"
		while read -r mod; do
			insmod "$mod" || fail "insmod $mod"
		done <"$list"
	done
	ip link set lo up
	sh /bin/transports-guest || fail "transports: $(grep -o 'E2E-TRANSPORTS-FAIL.*' /tmp/transports.fail 2>/dev/null || echo 'see the console')"
	result PASS
fi

ip link set lo up
i=0
until ip link set eth0 up 2>/dev/null; do
	i=$((i + 1))
	[ "$i" -gt 50 ] && fail "no eth0 after 5 s"
	sleep 0.1
done
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2

# With the default (a few MiB on a small guest) the kernel can run out of
# the reserve it needs to send swap-out requests over TCP, and freezes.
sysctl -w vm.min_free_kbytes="$minfree" >/dev/null || fail "sysctl vm.min_free_kbytes=$minfree"

daemon_pid=
case "$mode" in daemon | survive) metrics=127.0.0.1:9829 ;; esac
daemon_args=$(echo "${daemon_args:-}" | tr ',' ' ')
daemon_env=$(echo "${daemon_env:-}" | tr ',' ' ')
case "$mode" in
client)
	tlsargs=
	[ -z "$tls" ] || tlsargs="-certfile $tls/client-cert.pem -keyfile $tls/client-key.pem -cacertfile $tls/ca-cert.pem"
	# The TLS proxy's allocations must not wait for the writes of the
	# device it carries (flusher), and its pages, its own (cgroup) and
	# its program's and libraries' (ramfs), must never be swapped out to
	# it: its memory locks would not pass to it.
	guard= cg=
	case ",$tlsguard," in
	*,cgroup,*)
		mkdir -p /sys/fs/cgroup
		mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
		echo +memory >/sys/fs/cgroup/cgroup.subtree_control || fail "cgroup: +memory"
		mkdir -p /sys/fs/cgroup/nbd-tls
		echo 0 >/sys/fs/cgroup/nbd-tls/memory.swap.max || fail "cgroup: memory.swap.max=0"
		cg=/sys/fs/cgroup/nbd-tls/cgroup.procs
		;;
	esac
	case ",$tlsguard," in *,flusher,*) guard=ioflusher ;; esac
	[ -z "$tlsguard" ] || step "nbd-client guarded: $tlsguard ($(grep -o 'rootfstype=[a-z]*' /proc/cmdline || echo 'root on tmpfs'))"
	step "nbd-client $host $port -N $export -C $conns${tls:+ over TLS: $tlsargs}"
	cg=$cg sh -c '[ -z "$cg" ] || echo $$ >"$cg" || exit 99; exec "$@"' nbd-client \
		$guard nbd-client "$host" "$port" /dev/nbd0 -N "$export" -swap -b 4096 -C "$conns" $tlsargs ||
		fail "nbd-client could not connect"
	# With TLS the kernel's socket is one end of a socket pair whose other
	# end a forked nbd-client (the proxy) encrypts to the server: it must
	# outlive the nbd-client that configured the device.
	if [ -n "$tls" ]; then
		tls_proxies start
		[ -n "$(pidof nbd-client)" ] || fail "no nbd-client TLS proxy running after the connect"
	fi
	mkswap /dev/nbd0 >/dev/null || fail "mkswap"
	swapon -d /dev/nbd0 || fail "swapon -d"
	;;
daemon | survive)
	# The kernel device: /dev/nbd0, or with ublk whichever /dev/ublkbN
	# the driver numbers (kdev once it is swap).
	kdev=/dev/nbd0 kdev_re=/dev/nbd0 devargs="--device /dev/nbd0 --kernel-connections $kconns"
	if [ "$transport" = ublk ]; then
		[ -s /etc/e2e-modules-ublk ] || fail "kernel $(uname -r) has no ublk_drv module (E2E_KERNEL_META=linux-image-6.12-amd64)"
		while read -r mod; do
			insmod "$mod" || fail "insmod $mod"
		done </etc/e2e-modules-ublk
		# daemon: without the supervisor (the device goes with the
		# process); survive: with it, each takeover a ublk user recovery.
		kdev= kdev_re='/dev/ublkb[0-9]+' devargs="--transport ublk --supervise=false"
		[ "$mode" = daemon ] || devargs="--transport ublk"
	fi
	# The daemon logs straight to the console: a pipe or a file in tmpfs
	# would hide its last words when the guest freezes.
	step "gzramd serve --swap $devargs --size $size $daemon_args"
	mkdir -p /run/gzramd
	cg=
	if [ "$swapmax0" = 1 ]; then
		# As the systemd unit's MemorySwapMax=0: a cgroup whose pages,
		# the state's memfds included, are never swapped out (to the
		# device they back, which stalls while its server is replaced).
		mkdir -p /sys/fs/cgroup
		mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
		echo +memory >/sys/fs/cgroup/cgroup.subtree_control || fail "cgroup: +memory"
		mkdir -p /sys/fs/cgroup/gzramd
		echo 0 >/sys/fs/cgroup/gzramd/memory.swap.max || fail "cgroup: memory.swap.max=0"
		cg=/sys/fs/cgroup/gzramd/cgroup.procs
		step "gzramd in a cgroup with memory.swap.max=0"
	fi
	[ -z "$daemon_env" ] || step "gzramd's environment: $daemon_env"
	PATH=/usr/local/sbin:$PATH cg=$cg sh -c '[ -z "$cg" ] || echo $$ >"$cg" || exit 99; exec "$@"' gzramd \
		env $daemon_env gzramd serve --swap $devargs --size "$size" \
		--socket /run/gzramd/gzramd.sock --metrics 127.0.0.1:9829 $daemon_args \
		>/dev/console 2>&1 &
	daemon_pid=$!
	i=0
	while ! grep -qE "^$kdev_re " /proc/swaps; do
		if ! kill -0 "$daemon_pid" 2>/dev/null; then
			[ "$transport" = ublk ] ||
				echo "E2E-STEP: /dev/nbd0: size $(cat /sys/block/nbd0/size) sectors, pid $(cat /sys/block/nbd0/pid 2>/dev/null || echo none)"
			fail "gzramd exited before swap was on"
		fi
		i=$((i + 1))
		[ "$i" -gt 120 ] && fail "no swap on $kdev_re after 60 s"
		sleep 0.5
	done
	kdev=$(awk -v re="^$kdev_re\$" '$1 ~ re { print $1; exit }' /proc/swaps)
	# Every thread of every gzramd process is an IO flusher, so that
	# none of their allocations writes swap to the device they serve:
	# the supervisor re-executes itself as one, and its children inherit it.
	procs=$(gzramd_processes)
	set -- $(io_flushers $procs)
	[ "${2:-0}" -gt 0 ] && [ "$1" = "$2" ] || fail "IO flushers: ${1:-?} of ${2:-?} threads of gzramd's processes ($procs)"
	step "IO flushers: all $2 threads of gzramd's processes ($procs)"
	if [ "$transport" = ublk ]; then
		# What gzramd says it serves: /status and the metric.
		httpget "$metrics" /status >/tmp/status || fail "GET /status"
		httpget "$metrics" /metrics >/tmp/metrics || fail "GET /metrics"
		echo "E2E-TRANSPORT device=$kdev status=$(tr -d ' \n' </tmp/status | grep -o '"transport":"[a-z]*"' | head -n 1) metric=$(grep '^gzramd_transport_info' /tmp/metrics)"
		grep -q '"transport": "ublk"' /tmp/status || fail "/status does not say transport ublk"
		grep -q "\"device\": \"$kdev\"" /tmp/status || fail "/status does not name $kdev"
		grep -q '^gzramd_transport_info{transport="ublk"} 1$' /tmp/metrics || fail "no gzramd_transport_info{transport=\"ublk\"} 1"
		rm -f /tmp/status /tmp/metrics
	else
		# The kernel names the workers receiving nbd0's replies after their
		# workqueue while they run (kworker/u5:1+nbd0-recv on 6.1, and
		# nbd0-recv+nbd0-recv for its rescuer; +knbd0-recv elsewhere): gzramd waits
		# for those of dead connections to end before it hands the kernel
		# new sockets (pkg/nbddev/workers.go), and cannot unless it sees them.
		# A connection replaced at start (a self-test request that timed
		# out) may wait a while for a worker: the rescuer runs one at a time.
		i=0
		while :; do
			w=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -c -e '+nbd0-recv$' -e '+knbd0-recv$')
			[ "$w" = "$kconns" ] || [ "$i" -ge 20 ] && break
			i=$((i + 1))
			sleep 0.5
		done
		[ "$w" = "$kconns" ] || echo "E2E-WORKERS $(cat /proc/[0-9]*/comm 2>/dev/null | grep -e nbd -e kworker/u | tr '\n' ' ')"
		[ "$w" -ge 1 ] || fail "receive workers of nbd0: none seen running (want one per connection, $kconns): gzramd cannot tell when old ones have ended"
		step "receive workers of nbd0: $w running, for $kconns connections"
	fi
	;;
*) fail "unknown e2e.mode=$mode" ;;
esac

kdev=${kdev:-/dev/nbd0}
grep -q "^$kdev " /proc/swaps || fail "$kdev is not swap"
cat /proc/swaps
free
out0=$(vmstat_get pswpout) in0=$(vmstat_get pswpin)

# survive: the hog runs while a killer SIGKILLs the serving process (the
# supervisor's child, never the supervisor) again and again; each time the
# supervisor starts another that must take the state and the kernel device
# over with nothing lost. The verdict names every check that failed.
if [ "$mode" = survive ]; then
	echo 0 >/tmp/kills
	rm -f /tmp/hog.done
	out0=$(vmstat_get pswpout) in0=$(vmstat_get pswpin)
	step "survive: hog $hog MiB seed $seed; killing the serving process at least $kills times (at most $maxkills), $kmin-$kmax s after each start, every kill number divisible by $early during its takeover (0-$earlymax s after it took the state)"
	# A static helper (killer.c), locked in memory and real-time: a shell
	# loop was too slow to catch a takeover.
	echo 0 >/tmp/upgrades
	# Half the kills at most while the hog writes, so that some fall while
	# it verifies (survive.py wants both).
	rm -f /tmp/hog.wrote
	KILLER_WROTE_FILE=/tmp/hog.wrote killer "$daemon_pid" "$maxkills" "$kmin" "$kmax" "$early" "$earlymax" /tmp/hog.done /tmp/kills "$upgrade_every" "$quiet" /tmp/upgrades &
	killer_pid=$!
	# The hog verifies again and again until the killer has made the
	# kills and upgrades asked for (HOG_UNTIL_FILE, at most 12 passes):
	# on a slow machine a fixed hog ended first, and the run failed for
	# the harness's own schedule (14 kills of 20 with 8 upgrades asked).
	rm -f /tmp/enough
	(
		while [ "$(cat /tmp/kills 2>/dev/null || echo 0)" -lt "$kills" ] ||
			[ "$(cat /tmp/upgrades 2>/dev/null || echo 0)" -lt "$upgrades" ]; do
			[ -e /tmp/hog.done ] && exit 0
			sleep 1
		done
		touch /tmp/enough
	) &
	HOG_WROTE_FILE=/tmp/hog.wrote HOG_UNTIL_FILE=/tmp/enough hog "$hog" "$seed" "$random"
	hog_rc=$?
	touch /tmp/hog.done
	wait "$killer_pid"
	n=$(cat /tmp/kills) u=$(cat /tmp/upgrades)
	out=$(($(vmstat_get pswpout) - out0)) in=$(($(vmstat_get pswpin) - in0))
	echo "E2E-SWAP pswpout=$out pswpin=$in"
	echo "E2E-SURVIVE kills=$n upgrades=$u"
	why=
	bad() { why="${why:+$why; }$*"; }
	[ "$hog_rc" -eq 0 ] || bad "hog failed (exit $hog_rc)"
	[ "$out" -gt 0 ] || bad "the hog never swapped out (pswpout=0): the test proved nothing"
	[ "$n" -ge "$kills" ] || bad "only $n kills while the hog ran, want $kills (shorter intervals: E2E_SURVIVE_MAX_S)"
	[ "$u" -ge "$upgrades" ] || bad "only $u planned upgrades while the hog ran, want $upgrades"
	# The metrics of the serving process now (after the last kill it may
	# still be taking over).
	i=0
	until httpget "$metrics" /metrics >/tmp/metrics 2>/dev/null && grep -q '^gzramd_takeovers_total ' /tmp/metrics; do
		i=$((i + 1))
		[ "$i" -gt 240 ] && break
		sleep 0.5
	done
	takeovers=$(awk '$1 == "gzramd_takeovers_total" { print $2 }' /tmp/metrics 2>/dev/null)
	lost=$(awk '$1 == "gzramd_lost_pages" { print $2 }' /tmp/metrics 2>/dev/null)
	pause=$(awk '$1 == "gzramd_takeover_pause_seconds" { print $2 }' /tmp/metrics 2>/dev/null)
	grep -E '^gzramd_(takeover|lost_pages|stored_pages|packed_pages|tier_pages|dense_recompressed_groups|nbd_requests_total|table_late_faults_total)' /tmp/metrics 2>/dev/null | sed 's/^/E2E-METRIC end /'
	echo "E2E-SURVIVE takeovers_total=${takeovers:-none} lost_pages=${lost:-none} last_pause_seconds=${pause:-none}"
	# Each kill and each upgrade is one takeover, unless a kill fell on
	# the process that was to take over before it had (the next one then
	# takes over once for both): only the console shows that, so
	# survive.py checks the exact count. Here: never more than both.
	if [ -z "$takeovers" ]; then
		bad "no gzramd_takeovers_total: no serving process answered /metrics 120 s after the hog ended"
	elif ! awk -v t="$takeovers" -v n="$((n + u))" 'BEGIN { exit !(t + 0 <= n + 0) }'; then
		bad "gzramd_takeovers_total=$takeovers but only $n kills and $u upgrades"
	fi
	[ -n "$lost" ] && awk -v l="$lost" 'BEGIN { exit !(l + 0 == 0) }' || bad "gzramd_lost_pages=${lost:-none}, want 0"
	procs=$(gzramd_processes)
	set -- $(io_flushers $procs)
	[ "${2:-0}" -gt 0 ] && [ "$1" = "$2" ] || bad "IO flushers after the kills: ${1:-?} of ${2:-?} threads of gzramd's processes ($procs)"
	echo "E2E-SURVIVE io_flushers=${1:-?}/${2:-?}"
	# The kernel's log since boot (its first line proves none scrolled
	# away): no I/O error anywhere, and nothing from nbd but what a server
	# that dies and is replaced makes it say (test/e2e/README.md).
	# What the kernel says when the server of a netlink-attached device with
	# request and dead-connection timeouts dies and another takes over
	# (drivers/block/nbd.c): the dead server's sockets fail (recv_work,
	# also in the middle of a read's reply, sends on them: EPIPE,
	# ECONNRESET), requests wait for a connection
	# (find_fallback) or time out and are requeued (nbd_xmit_timeout), and
	# the new server's sockets are taken (nbd_reconnect_socket). Plus the
	# driver's load, the attach and swapon.
	nbd_expected='^nbd: registered device at major 43$'
	nbd_expected="$nbd_expected"'|^nbd0: detected capacity change from 0 to [0-9]+$'
	nbd_expected="$nbd_expected"'|^Adding [0-9]+k swap on /dev/nbd0\.'
	nbd_expected="$nbd_expected"'|^block nbd0: Receive control failed \(result -(32|104)\)$'
	nbd_expected="$nbd_expected"'|^block nbd0: Receive data failed \(result -(32|104)\)$'
	nbd_expected="$nbd_expected"'|^block nbd0: Send (control|data) failed \(result -(32|104)\)$'
	nbd_expected="$nbd_expected"'|^block nbd0: Request send failed, requeueing$'
	nbd_expected="$nbd_expected"'|^block nbd0: Dead connection, failed to find a fallback$'
	nbd_expected="$nbd_expected"'|^block nbd0: Connection timed out, retrying \([0-9]+/[0-9]+ alive\)$'
	nbd_expected="$nbd_expected"'|^block nbd0: reconnected socket$'
	nbd_expected="$nbd_expected"'|^[a-z_]*nbd[a-z_]*: [0-9]+ callbacks suppressed$'
	# Over ublk the driver says nothing of a server that dies and the
	# next that recovers the device: only swapon is expected.
	kname=nbd
	if [ "$transport" = ublk ]; then
		kname=ublk nbd_expected='^Adding [0-9]+k swap on /dev/ublkb[0-9]+\.'
	fi
	dmesg >/tmp/dmesg
	grep -q 'Linux version' /tmp/dmesg || bad "dmesg no longer starts at boot: its buffer overflowed, the check cannot be made"
	grep -iE "$kname"'|I/O error|Read-error|Write-error|critical|blk_update_request|Buffer I/O' /tmp/dmesg |
		sed 's/^\[[ 0-9.]*\] //; s/(result -\{0,1\}[0-9]*)/(result N)/; s/([0-9]*\/[0-9]* alive)/(N\/M alive)/' |
		sort | uniq -c | sed 's/^ */E2E-DMESG /'
	grep -iE 'I/O error|Read-error|Write-error|critical|blk_update_request|Buffer I/O' /tmp/dmesg >/tmp/dmesg.io
	# For survive.py, which forgives a kill that interrupted a takeover
	# only while nothing was lost.
	echo "E2E-SURVIVE io_error_lines=$(($(wc -l </tmp/dmesg.io)))"
	[ -s /tmp/dmesg.io ] && bad "kernel I/O errors: $(wc -l </tmp/dmesg.io) lines, first: $(head -1 /tmp/dmesg.io | sed 's/^\[[ 0-9.]*\] //')"
	grep -i "$kname" /tmp/dmesg | sed 's/^\[[ 0-9.]*\] //' | grep -v '^Kernel command line: \|^Command line: ' | grep -vE "$nbd_expected" >/tmp/dmesg.nbd
	[ -s /tmp/dmesg.nbd ] && bad "unexpected $kname kernel messages: $(wc -l </tmp/dmesg.nbd) lines, first: $(head -1 /tmp/dmesg.nbd)"
	step "stopping"
	stop_gzramd || bad "gzramd still running 120 s after SIGTERM (E2E-STACK lines: where its threads were at 60 s)"
	if ! kill -0 "$daemon_pid" 2>/dev/null; then
		wait "$daemon_pid"
		rc=$?
		[ "$rc" -eq 0 ] || bad "gzramd exited $rc after SIGTERM"
		grep -q "^$kdev " /proc/swaps && bad "gzramd stopped but $kdev is still swap"
		if [ "$transport" = ublk ]; then
			[ -e "/sys/block/${kdev#/dev/}" ] && bad "gzramd stopped but $kdev is still a block device"
		fi
	fi
	[ -z "$why" ] || fail "$why"
	result PASS
fi

step "hog $hog MiB seed $seed"
# At the hog's peak, most of it is in swap: the moment to see pages stored.
if [ -n "$metrics" ]; then
	HOG_PEAK_CMD="httpget $metrics /metrics >/tmp/metrics.peak" hog "$hog" "$seed" "$random"
else
	hog "$hog" "$seed" "$random"
fi
hog_rc=$?
out=$(($(vmstat_get pswpout) - out0)) in=$(($(vmstat_get pswpin) - in0))
echo "E2E-SWAP pswpout=$out pswpin=$in"
cat /proc/swaps
[ -z "$tls" ] || tls_proxies after-hog

if [ -n "$metrics" ]; then
	[ -s /tmp/metrics.peak ] || echo "E2E-STEP: no metrics scraped at the hog's peak"
	grep '^gzramd_' /tmp/metrics.peak | grep -v '_bucket{' | sed 's/^/E2E-METRIC peak /'
	# Swap reaches never-used parts of the device in order, or 64 MiB a
	# cluster before Linux 6.18: gzramd-table keeps the page table faulted
	# in ahead of it, and no write faults it.
	late=$(awk '$1 == "gzramd_table_late_faults_total" { print $2 }' /tmp/metrics.peak 2>/dev/null)
	rm -f /tmp/metrics.peak
	[ "${late:-0}" = 0 ] || fail "gzramd_table_late_faults_total=$late at the hog's peak: swap wrote beyond the page table faulted in ahead of it"
fi

step "stopping"
case "$mode" in
client)
	swapoff /dev/nbd0 || fail "swapoff"
	nbd-client -d /dev/nbd0 || fail "nbd-client -d"
	scrape end
	;;
daemon)
	scrape end
	# A clean stop must take the swap off before the daemon goes away.
	stop_gzramd || fail "gzramd still running 120 s after SIGTERM (E2E-STACK lines: where its threads were at 60 s)"
	wait "$daemon_pid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "gzramd exited $rc after SIGTERM"
	grep -q "^$kdev " /proc/swaps && fail "gzramd stopped but $kdev is still swap"
	if [ "$transport" = ublk ]; then
		# Stopped and deleted: no block device, no char device.
		[ -e "/sys/block/${kdev#/dev/}" ] && fail "gzramd stopped but $kdev is still a block device"
		[ -e "/sys/class/ublk-char/ublkc${kdev#/dev/ublkb}" ] && fail "gzramd stopped but ublkc${kdev#/dev/ublkb} is still there"
		step "$kdev removed"
	fi
	;;
esac

[ "$hog_rc" -eq 0 ] || fail "hog found wrong data (exit $hog_rc)"
[ "$out" -gt 0 ] || fail "the hog never swapped out (pswpout=0): the test proved nothing"
result PASS
