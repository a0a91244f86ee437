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
[ "$mode" = daemon ] && metrics=127.0.0.1:9829
daemon_args=$(echo "${daemon_args:-}" | tr ',' ' ')
case "$mode" in
client)
	step "nbd-client $host $port -N $export -C $conns"
	nbd-client "$host" "$port" /dev/nbd0 -N "$export" -swap -b 4096 -C "$conns" ||
		fail "nbd-client could not connect"
	mkswap /dev/nbd0 >/dev/null || fail "mkswap"
	swapon -d /dev/nbd0 || fail "swapon -d"
	;;
daemon)
	# The daemon logs straight to the console: a pipe or a file in tmpfs
	# would hide its last words when the guest freezes.
	step "gzramd serve --swap --device /dev/nbd0 --size $size --kernel-connections $kconns $daemon_args"
	mkdir -p /run/gzramd
	PATH=/usr/local/sbin:$PATH gzramd serve --swap --device /dev/nbd0 --size "$size" \
		--socket /run/gzramd/gzramd.sock --metrics 127.0.0.1:9829 --kernel-connections "$kconns" $daemon_args \
		>/dev/console 2>&1 &
	daemon_pid=$!
	i=0
	while ! grep -q '^/dev/nbd0 ' /proc/swaps; do
		if ! kill -0 "$daemon_pid" 2>/dev/null; then
			echo "E2E-STEP: /dev/nbd0: size $(cat /sys/block/nbd0/size) sectors, pid $(cat /sys/block/nbd0/pid 2>/dev/null || echo none)"
			fail "gzramd exited before swap was on"
		fi
		i=$((i + 1))
		[ "$i" -gt 120 ] && fail "no swap on /dev/nbd0 after 60 s"
		sleep 0.5
	done
	;;
*) fail "unknown e2e.mode=$mode" ;;
esac

grep -q '^/dev/nbd0 ' /proc/swaps || fail "/dev/nbd0 is not swap"
cat /proc/swaps
free
out0=$(vmstat_get pswpout) in0=$(vmstat_get pswpin)

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

if [ -n "$metrics" ]; then
	[ -s /tmp/metrics.peak ] || echo "E2E-STEP: no metrics scraped at the hog's peak"
	grep '^gzramd_' /tmp/metrics.peak | grep -v '_bucket{' | sed 's/^/E2E-METRIC peak /'
	rm -f /tmp/metrics.peak
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
	kill -TERM "$daemon_pid"
	i=0
	while kill -0 "$daemon_pid" 2>/dev/null; do
		i=$((i + 1))
		[ "$i" -gt 240 ] && fail "gzramd still running 120 s after SIGTERM"
		sleep 0.5
	done
	wait "$daemon_pid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "gzramd exited $rc after SIGTERM"
	grep -q '^/dev/nbd0 ' /proc/swaps && fail "gzramd stopped but /dev/nbd0 is still swap"
	;;
esac

[ "$hog_rc" -eq 0 ] || fail "hog found wrong data (exit $hog_rc)"
[ "$out" -gt 0 ] || fail "the hog never swapped out (pswpout=0): the test proved nothing"
result PASS
