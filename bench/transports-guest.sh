#!/bin/sh
# The guest's half of bench/transports.sh (issue 38, item 5): run by
# test/e2e/init.sh's transports mode, in one boot of a 6.12 guest, with
# busybox's sh. For each device kind (zram, gzramd over the kernel's NBD
# client, gzramd over ublk), each recorded trace and job count, on a fresh
# device: fio replays the trace with libaio and O_DIRECT; then, on another
# fresh device, a region is written and read back at random, 4 KiB at QD1.
# Each measurement goes to /dev/ttyS1 (the host's second serial file) as
#   T-BEGIN id device workload jobs round gzramd-ticks cpu-fields...
#   T-END id gzramd-ticks cpu-fields...
#   T-JSON-BEGIN id / fio's JSON / T-JSON-END id
# where cpu-fields are /proc/stat's cpu line (USER_HZ ticks) and
# gzramd-ticks the utime+stime of gzramd's processes; and gzramd's idle
# memory after each start as
#   T-FOOT device round rss-kB pss-kB processes threads
# Parameters come on the kernel command line as e2e.t_NAME=VALUE (lists
# comma-separated); bench/transports.sh sets them.
devices=zram,nbd,ublk jobs=1,4 repeat=1 iodepth=32 rounds=1 size=512MiB
zalg=lz4 kconns= gargs=--backend,cpu,--supervise=false idle_s=10
qd1_mib=64 qd1_s=10 traces= profile=0
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	e2e.t_*=*) kv=${arg#e2e.t_}; eval "${kv%%=*}='${kv#*=}'" ;;
	esac
done
devices=$(echo "$devices" | tr ',' ' ')
jobs=$(echo "$jobs" | tr ',' ' ')
gargs=$(echo "$gargs" | tr ',' ' ')
# The NBD device gets as many connections as ublk gets queues (pkg/ublk:
# one per CPU, at most 4), unless told.
ncpu=$(nproc)
[ -n "$kconns" ] || kconns=$((ncpu < 4 ? ncpu : 4))
OUT=/dev/ttyS1
stty -F "$OUT" raw -echo 2>/dev/null
TD=/etc/transports
[ -n "$traces" ] || traces=$(cd "$TD" && ls *.env | sed 's/\.env$//' | tr '\n' ',')
traces=$(echo "$traces" | tr ',' ' ')

die() {
	echo "E2E-TRANSPORTS-FAIL $*" | tee /tmp/transports.fail
	[ -z "$glog" ] || tail -n 20 "$glog" | sed 's/^/E2E-GZRAMD /'
	exit 1
}
say() { echo "E2E-STEP: transports: $*"; }
emit() { echo "$*" >>"$OUT"; }
cpu_fields() { awk '$1 == "cpu" { $1 = ""; print }' /proc/stat; }
# clock: the guest's uptime (s) and the time its tasks ran, by the
# scheduler's clock (ns, /proc/schedstat's rq_cpu_time summed over the
# CPUs; 0 without schedstats): under TCG /proc/stat's ticks miss what the
# host's scheduler took from a vCPU's thread.
clock() {
	echo "$(cut -d' ' -f1 /proc/uptime) $(awk '/^cpu[0-9]/ { s += $8 } END { printf "%.0f", s }' /proc/schedstat 2>/dev/null || echo 0)"
}
gz_pids() { pidof gzramd 2>/dev/null; }
# gz_ticks: utime+stime of gzramd's processes, their ended threads
# included (fields 14 and 15 of /proc/PID/stat).
gz_ticks() {
	for p in $(gz_pids); do cat /proc/"$p"/stat 2>/dev/null; done |
		awk '{ sub(/.*\) /, ""); t += $12 + $13 } END { printf "%.0f\n", t }'
}

gpid= dev= glog= starts=0
# dev_start KIND: a fresh device of that kind; sets dev.
dev_start() {
	case "$1" in
	zram)
		echo 1 >/sys/block/zram0/reset || die "zram0: reset"
		echo "$zalg" >/sys/block/zram0/comp_algorithm || die "zram0: no $zalg in $(cat /sys/block/zram0/comp_algorithm)"
		echo "$size" >/sys/block/zram0/disksize || die "zram0: disksize $size"
		dev=/dev/zram0
		;;
	nbd | ublk)
		local devargs="--device /dev/nbd0 --kernel-connections $kconns"
		[ "$1" = nbd ] || devargs="--transport ublk --device auto"
		mkdir -p /run/gzramd
		# A log of its own for each start: the shell may look for the
		# ready line before the child has opened (truncated) the file.
		starts=$((starts + 1))
		glog=/tmp/gzramd.$starts.log
		: >"$glog"
		# With profile=1 (a gzramd built with -tags pprof), a CPU profile
		# of each start, sent back as a T-PROF line at its stop.
		local prof=
		[ "$profile" != 1 ] || prof=/tmp/gzramd.$starts.$1.prof
		# shellcheck disable=SC2086 # lists of flags
		GZRAMD_CPUPROFILE=$prof gzramd serve $devargs --size "$size" --socket /run/gzramd/gzramd.sock --metrics '' $gargs \
			>"$glog" 2>&1 &
		gpid=$!
		local i=0
		until grep -q 'msg="gzramd ready"' "$glog"; do
			kill -0 "$gpid" 2>/dev/null || die "gzramd ($1) exited before it was ready"
			i=$((i + 1))
			[ "$i" -le 1200 ] || die "gzramd ($1) not ready after 120 s"
			sleep 0.1
		done
		dev=$(grep -o 'msg="gzramd ready".* device=[^ ]*' "$glog" | sed 's/.* device=//')
		[ -b "$dev" ] || die "gzramd ($1) is ready but its device \"$dev\" is no block device"
		;;
	*) die "unknown device kind $1" ;;
	esac
}

dev_stop() {
	case "$1" in
	zram) echo 1 >/sys/block/zram0/reset || die "zram0: reset after the run" ;;
	*)
		kill -TERM "$gpid"
		wait "$gpid" || die "gzramd ($1) exited $? after SIGTERM"
		local prof=/tmp/gzramd.$starts.$1.prof
		[ ! -s "$prof" ] || emit "T-PROF $1 $starts $(base64 "$prof" | tr -d '\n')"
		grep -E 'level=(WARN|ERROR)' "$glog" | grep -v 'will not survive the serving process' |
			sed "s/^/E2E-GZRAMD $1: /" | head -n 5
		gpid=
		;;
	esac
}

# footprint KIND ROUND: gzramd's own memory, idle after its start (after
# idle_s, by default past the 5 s after which its prefaulter gives half
# its reserve back): RSS, PSS (smaps_rollup), anonymous, file and locked
# memory of its processes, their threads, and the CPU ticks gzramd and the
# whole guest spent over the idle seconds.
footprint() {
	[ "$1" != zram ] || return 0
	local g0 c0 g1 c1 v rss=0 pss=0 anon=0 file=0 lck=0 n=0 t=0 p
	g0=$(gz_ticks) c0=$(cpu_fields)
	sleep "$idle_s"
	g1=$(gz_ticks) c1=$(cpu_fields)
	for p in $(gz_pids); do
		n=$((n + 1))
		v=$(awk '$1 == "VmRSS:" { r = $2 } $1 == "RssAnon:" { a = $2 } $1 == "RssFile:" { f = $2 } $1 == "VmLck:" { l = $2 } $1 == "Threads:" { t = $2 }
			END { print r + 0, a + 0, f + 0, l + 0, t + 0 }' /proc/"$p"/status)
		set -- "$1" "$2" $v
		rss=$((rss + $3)) anon=$((anon + $4)) file=$((file + $5)) lck=$((lck + $6)) t=$((t + $7))
		pss=$((pss + $(awk '$1 == "Pss:" { print $2 }' /proc/"$p"/smaps_rollup)))
	done
	emit "T-FOOT $1 $2 $rss $pss $n $t $anon $file $lck $((g1 - g0)) $(echo "$c0 $c1" | awk '{ h = NF / 2; for (i = 1; i <= h; i++) if (i <= 3 || i >= 6 && i <= 8) b += $(i + h) - $i; print b }') $idle_s"
	say "$1: gzramd idle: RSS $rss kB, PSS $pss kB (anonymous $anon, file $file, locked $lck), $n process(es), $t threads; $((g1 - g0)) ticks of its CPU in $idle_s s"
	grep -o 'msg="kernel device created".*' "$glog" | sed 's/^/E2E-GZRAMD /'
	# Where the resident memory is: every mapping of 1 MiB or more.
	for p in $(gz_pids); do
		awk -v kind="$1" '$1 ~ /^[0-9a-f]+-[0-9a-f]+$/ { range = $1; name = NF >= 6 ? $6 : "[anon]" }
			$1 == "Rss:" && $2 >= 1024 { printf "E2E-GZRAMD %s: mapping %s %s: %d kB resident\n", kind, range, name, $2 }' /proc/"$p"/smaps
	done
	[ "$1" != ublk ] || emit "T-UBLK $(grep -o 'queues=[0-9]* depth=[0-9]* max_io_bytes=[0-9]*' "$glog" | head -n 1)"
}

id=0
# measure KIND WORKLOAD JOBS ROUND FIO-ARGS...: one fio run on $dev,
# bracketed by the CPU counters, its JSON to the results port.
measure() {
	local kind=$1 wl=$2 j=$3 r=$4
	shift 4
	id=$((id + 1))
	emit "T-BEGIN $id $kind $wl $j $r $(gz_ticks) $(cpu_fields)"
	emit "T-CLOCK $id begin $(clock)"
	fio --output-format=json --output=/tmp/fio.json --group_reporting --numjobs="$j" \
		--ioengine=libaio --direct=1 --lat_percentiles=1 --buffer_compress_percentage=50 --buffer_compress_chunk=4096 \
		"$@" >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; die "fio $wl ($kind, $j jobs) failed"; }
	emit "T-CLOCK $id end $(clock)"
	emit "T-END $id $(gz_ticks) $(cpu_fields)"
	emit "T-JSON-BEGIN $id"
	cat /tmp/fio.json >>"$OUT"
	emit "T-JSON-END $id"
	say "$kind $wl jobs=$j: $(awk -F'[:,]' '/"io_bytes"/ { b += $2 } END { printf "%.0f MB moved", b / 1e6 }' /tmp/fio.json)"
}

# replay T: the trace T's replay log, repeated $repeat times (the last
# copy ends at its last read or write: bench/transports.sh), and the I/Os
# it issues, after which each job waits to reap everything.
replay_log() {
	. "$TD/$1.env"
	{
		cat "$TD/$1.head"
		i=1
		while [ "$i" -lt "$repeat" ]; do
			cat "$TD/$1.body"
			i=$((i + 1))
		done
		cat "$TD/$1.last" "$TD/$1.tail"
	} >/tmp/replay.iolog
	replay_ios=$((rw * repeat))
}

say "kernel $(uname -r), $ncpu CPUs, $(awk '/MemTotal/ { print $2 }' /proc/meminfo) kB; devices $devices; traces $traces; jobs $jobs; repeat $repeat; rounds $rounds; fio $(fio --version)"
emit "T-GUEST kernel=$(uname -r) cpus=$ncpu mem_kb=$(awk '/MemTotal/ { print $2 }' /proc/meminfo) kconns=$kconns fio=$(fio --version) zram_algs=$(tr ' ' '/' </sys/block/zram0/comp_algorithm)"
r=1
while [ "$r" -le "$rounds" ]; do
	order=$devices
	# Every other round the other way round: drift favours no device.
	[ $((r % 2)) = 1 ] || order=$(echo "$devices" | tr ' ' '\n' | sed '1!G;h;$!d' | tr '\n' ' ')
	for kind in $order; do
		first=1
		for t in $traces; do
			replay_log "$t"
			for j in $jobs; do
				dev_start "$kind"
				[ "$first" = 0 ] || footprint "$kind" "$r"
				first=0
				measure "$kind" "trace:$t" "$j" "$r" --name=replay --read_iolog=/tmp/replay.iolog \
					--replay_redirect="$dev" --replay_no_stall=1 --iodepth="$iodepth" \
					--thinktime=1 --thinktime_blocks="$replay_ios" --thinktime_blocks_type=issue
				dev_stop "$kind"
			done
		done
		if [ "$qd1_mib" != 0 ]; then
			dev_start "$kind"
			[ "$first" = 0 ] || footprint "$kind" "$r"
			measure "$kind" fill 1 "$r" --name=fill --filename="$dev" --rw=write --bs=64k --iodepth=16 \
				--size="${qd1_mib}M"
			measure "$kind" qd1-randread-4k 1 "$r" --name=qd1 --filename="$dev" --rw=randread --bs=4k \
				--iodepth=1 --size="${qd1_mib}M" --time_based --runtime="$qd1_s" --norandommap --randrepeat=1
			dev_stop "$kind"
		fi
	done
	r=$((r + 1))
done
emit "T-DONE"
say "done"
