#!/usr/bin/env bash
# What each transport costs the real kernel (issue 38, item 5): in one boot
# of Debian's 6.12 kernel under QEMU (test/e2e's machinery), on the same
# guest, kernel zram, gzramd over the kernel's NBD client (/dev/nbd0,
# gzramd serve --device /dev/nbd0) and gzramd over ublk (/dev/ublkbN,
# --transport ublk), each measured with fio's libaio engine and O_DIRECT
# on the block device:
#   - each recorded swap trace (bench/traces/*.iolog.zst) replayed as
#     bench/trace.sh replays it (read_iolog, replay_no_stall, iodepth 32,
#     the trace repeated TRANSPORTS_REPEAT times by each job, half-
#     compressible data, a fresh device for each run), at 1 and 4 jobs;
#   - 4 KiB random reads at QD1 of a region written first (fresh device).
# For each: MB/s, the guest's CPU-seconds per GB moved (user+nice+system+
# irq+softirq+steal of the guest's /proc/stat over the fio run, not idle,
# not iowait; gzramd's own share from its processes' utime+stime), and the
# reads' completion latency p50/p99 (fio's clat); gzramd's idle memory
# (RSS and PSS of its processes) after each start. The guest half is
# bench/transports-guest.sh (init.sh's e2e.mode=transports); its results
# come back on a second serial port. The report (markdown: a table per
# measurement, ublk/NBD and ublk/zram ratios, the footprint, issue 38's
# targets met or missed) and a machine-readable line per measurement go to
# stdout and TRANSPORTS_OUT.
#
# Usage: bench/transports.sh            (make bench-transports)
#        bench/transports.sh --layer OUT   only the guest's extra archive
#                                          (gpu-e2e-bundle.sh carries it)
# Environment (lists space-separated):
#   TRANSPORTS_OUT      report directory (default /tmp/gzramd-transports)
#   TRANSPORTS_DEVICES  default "zram nbd ublk"
#   TRANSPORTS_TRACES   trace names under bench/traces (default: all)
#   TRANSPORTS_JOBS     fio job counts for the traces (default "1 4")
#   TRANSPORTS_REPEAT   times each job replays the trace (default 1)
#   TRANSPORTS_IODEPTH  the replay's iodepth (default 32)
#   TRANSPORTS_QD1_MIB  the QD1 region (default 64; 0: no QD1 reads)
#   TRANSPORTS_QD1_S    seconds of QD1 reads (default 10)
#   TRANSPORTS_ROUNDS   rounds of every device (default 1; every other round
#                       in the reverse order; the report gives medians)
#   TRANSPORTS_SMP      the guest's vCPUs (default: the host's CPUs, at most 4)
#   TRANSPORTS_MEM      the guest's memory (default 1024M)
#   TRANSPORTS_SIZE     every device's size (default: the traces' extent)
#   TRANSPORTS_ZRAM_ALG zram's algorithm (default lz4: Debian's 6.12 is built
#                       without zram's lzo backend, lz4 is its default)
#   TRANSPORTS_KCONNS   gzramd's NBD connections (default: as many as ublk's
#                       queues, one per vCPU, at most 4)
#   TRANSPORTS_GZRAMD_ARGS  gzramd's flags, comma-separated (default
#                       --backend,cpu,--supervise=false: the same process
#                       model for both transports)
#   TRANSPORTS_TIMEOUT  seconds before the guest counts as hung (3600)
#   TRANSPORTS_PROFILE  1: a CPU profile of each gzramd start, written to
#                       the report directory as gzramd-DEVICE-N.pprof (GZRAMD
#                       must be built with -tags pprof: go tool pprof -top
#                       GZRAMD FILE)
#   E2E_TCG_THREAD      multi by default here (one host thread per vCPU)
#   E2E_BUNDLE          QEMU, the kernel, the initramfs and this archive
#                       from a bundle made by test/e2e/gpu-e2e-bundle.sh
#                       with E2E_BUNDLE_TRANSPORTS=1, for a machine without
#                       Debian's packages (nothing built, nothing fetched)
#   GZRAMD, E2E_KEEP, E2E_ACCEL: as for test/e2e/run.sh
# fio comes from Debian's source of fio (apt-get source, the version
# Debian ships), built static with libaio (libaio-dev; as root, installed
# if missing) and cached in .e2e/fio: Debian's binary needs 84 MB of
# libraries (ceph, gluster, rdma).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export E2E_ROOT=$ROOT
. "$ROOT/test/e2e/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

GZRAMD=${GZRAMD:-$ROOT/bin/gzramd}
TRACE_DIR=$ROOT/bench/traces

# fio_static: a static fio with libaio, built from Debian's source once
# and cached; sets FIO.
fio_static() {
	local dir=$E2E_CACHE/fio apt ver src
	FIO=$(ls "$dir"/fio-*-static 2>/dev/null | sort -V | tail -1 || true)
	[ -z "$FIO" ] || return 0
	log "building a static fio from Debian's source (once; cached in $dir)"
	command -v gcc >/dev/null && command -v make >/dev/null || die "gcc and make are needed to build fio"
	if [ ! -e /usr/include/libaio.h ] || ! ls /usr/lib/*/libaio.a >/dev/null 2>&1; then
		[ "$(id -u)" = 0 ] || die "libaio-dev missing (apt-get install libaio-dev, as root)"
		apt-get install -y -qq libaio-dev >/dev/null 2>&1 ||
			{ apt-get update -qq && apt-get install -y -qq libaio-dev >/dev/null; } || die "apt-get install libaio-dev"
	fi
	# A private deb-src list: the system's apt configuration stays as it is.
	apt=$dir/apt
	rm -rf "$apt" && mkdir -p "$apt/parts" "$apt/lists/partial" "$apt/cache" "$apt/src"
	local suite
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
	printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$suite" >"$apt/parts/src.sources"
	local aopt=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/parts"
		-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
	apt-get "${aopt[@]}" -qq update >/dev/null || die "apt-get update (deb-src $suite)"
	(cd "$apt/src" && apt-get "${aopt[@]}" -qq source --download-only fio >/dev/null 2>&1) ||
		die "apt-get source --download-only fio"
	src=$(ls "$apt"/src/fio_*.orig.tar.* | head -1)
	ver=$(basename "$src" | sed 's/^fio_//; s/\.orig\.tar\..*//')
	tar -C "$apt/src" -xf "$src" || die "unpacking $src"
	(
		cd "$apt/src/fio-$ver" &&
			./configure --build-static --disable-native --disable-numa --disable-rdma --disable-rados \
				--disable-rbd --disable-http --disable-gfapi --disable-pmem --disable-xnvme \
				--disable-libzbc --disable-tcmalloc --disable-dfs --disable-lex &&
			grep -q '^CONFIG_LIBAIO=y' config-host.mak &&
			make -j"$(nproc)" fio
	) >"$dir/build.log" 2>&1 || die "building fio $ver failed: $dir/build.log"
	strip -o "$dir/fio-$ver-static" "$apt/src/fio-$ver/fio"
	rm -rf "$apt"
	FIO=$dir/fio-$ver-static
	log "fio $ver built: $FIO ($(du -h "$FIO" | cut -f1))"
}

# trace_split NAME IOLOG DIR: the trace in the pieces the guest puts
# together $repeat times over (transports-guest.sh's replay_log), as
# bench/trace.sh's replay log: DIR/NAME.head (fio's header), .body (the
# requests), .last (the requests up to the last read or write: a job's
# last copy ends there, then reaps what is in flight), .tail (close
# lines) and .env (its counts). fio 3.33 replays no trims ("bad ddir"):
# they are left out, as bench/trace.sh leaves them out with it.
trace_split() {
	local name=$1 log=$2 d=$3
	awk -v d="$d/$name" '
		NR == 1 || NF == 2 && $2 != "close" { print > (d ".head"); next }
		NF == 2 { print > (d ".tail"); next }
		NF == 4 && $2 == "trim" { trims++; next }
		NF == 4 {
			body[++n] = $0; c[$2]++; b[$2] += $4
			if ($2 == "read" || $2 == "write") { last = n; rw++ }
			if ($3 + $4 > end) end = $3 + $4
		}
		END {
			for (i = 1; i <= n; i++) { print body[i] > (d ".body"); if (i <= last) print body[i] > (d ".last") }
			printf "rw=%.0f reads=%.0f writes=%.0f syncs=%.0f trims_left_out=%.0f read_bytes=%.0f write_bytes=%.0f end=%.0f\n", rw, c["read"], c["write"], c["sync"], trims, b["read"], b["write"], end > (d ".env")
		}' "$log"
	touch "$d/$name.tail"
	[ -s "$d/$name.last" ] || die "trace $name holds no reads or writes"
}

# transports_layer OUT: the guest's extra archive (uncompressed cpio, appended
# to the base initramfs): fio, transports-guest, gzramd with its
# libraries, zram's modules (/etc/e2e-modules-zram, in load order) and the
# traces in pieces (/etc/transports). Needs KROOT and KVER.
transports_layer() {
	local out=$1 root t name
	fio_static
	[ -x "$GZRAMD" ] || die "$GZRAMD not built (make build)"
	root=$(mktemp -d "$E2E_CACHE/tmp.XXXXXX")
	E2E_TMPS+=("$root")
	install -D -m 0755 "$FIO" "$root/bin/fio"
	install -D -m 0755 "$ROOT/bench/transports-guest.sh" "$root/bin/transports-guest"
	copy_with_libs "$root" "$GZRAMD" /bin/gzramd
	mkdir -p "$root/etc/transports"
	: >"$root/etc/e2e-modules-zram"
	modules_copy "$root" /etc/e2e-modules-zram zram
	grep -q '/zram.ko' "$root/etc/e2e-modules-zram" || die "kernel $KVER has no zram module"
	for t in "$TRACE_DIR"/*.iolog.zst; do
		name=$(basename "$t" .iolog.zst)
		zstd -q -d -c "$t" >"$root/etc/transports/$name.iolog" || die "zstd -d $t"
		head -1 "$root/etc/transports/$name.iolog" | grep -q '^fio version 2 iolog' || die "$t is not a fio iolog, version 2"
		trace_split "$name" "$root/etc/transports/$name.iolog" "$root/etc/transports"
		rm "$root/etc/transports/$name.iolog"
	done
	mkdir -p "$(dirname "$out")"
	(cd "$root" && find . | cpio -o -H newc --quiet) >"$out"
}

if [ "${1:-}" = --layer ]; then
	[ -n "${2:-}" ] || die "usage: bench/transports.sh --layer OUT"
	export E2E_KERNEL_META=${E2E_KERNEL_META:-linux-image-6.12-amd64}
	kernel_fetch
	transports_layer "$2"
	log "transports archive $2 ($(du -h "$2" | cut -f1), kernel $KVER)"
	exit 0
fi

OUTDIR=${TRANSPORTS_OUT:-/tmp/gzramd-transports}
DEVICES=${TRANSPORTS_DEVICES:-zram nbd ublk}
JOBS=${TRANSPORTS_JOBS:-1 4}
REPEAT=${TRANSPORTS_REPEAT:-1}
IODEPTH=${TRANSPORTS_IODEPTH:-32}
QD1_MIB=${TRANSPORTS_QD1_MIB:-64}
QD1_S=${TRANSPORTS_QD1_S:-10}
ROUNDS=${TRANSPORTS_ROUNDS:-1}
NCPU=$(nproc)
SMP=${TRANSPORTS_SMP:-$((NCPU < 4 ? NCPU : 4))}
MEM=${TRANSPORTS_MEM:-1024M}
ZALG=${TRANSPORTS_ZRAM_ALG:-lz4}
GARGS=${TRANSPORTS_GZRAMD_ARGS:---backend,cpu,--supervise=false}
TIMEOUT=${TRANSPORTS_TIMEOUT:-3600}
export E2E_TCG_THREAD=${E2E_TCG_THREAD:-multi}
for v in REPEAT IODEPTH QD1_MIB QD1_S ROUNDS SMP TIMEOUT; do
	[[ ${!v} =~ ^[0-9]+$ ]] || die "TRANSPORTS_$v=${!v}: a whole number"
done
[ "$REPEAT" -ge 1 ] && [ "$ROUNDS" -ge 1 ] || die "TRANSPORTS_REPEAT and TRANSPORTS_ROUNDS: at least 1"
for d in $DEVICES; do
	case "$d" in zram | nbd | ublk) ;; *) die "TRANSPORTS_DEVICES: $d is not zram, nbd or ublk" ;; esac
done
[[ $GARGS != *" "* ]] || die "TRANSPORTS_GZRAMD_ARGS: comma-separated, no spaces"

mkdir -p "$E2E_CACHE" "$OUTDIR"
e2e_workdir /tmp/gzramd-transports.XXXXXX "the console and the results"
T0=$SECONDS
if [ -n "${E2E_BUNDLE:-}" ]; then
	bundle_open
	bundle_kernel
	[ -n "${TRANSPORTS_FILE:-}" ] && [ -f "$E2E_BUNDLE/$TRANSPORTS_FILE" ] ||
		die "the bundle carries no transports archive: make it with E2E_BUNDLE_TRANSPORTS=1 ./test/e2e/gpu-e2e-bundle.sh"
	LAYER=$E2E_BUNDLE/$TRANSPORTS_FILE
	GZRAMD=$E2E_BUNDLE/${GZRAMD_FILE:-none}
else
	[ "${E2E_NO_DEPS:-0}" = 1 ] || "$E2E_DIR/deps.sh"
	export E2E_KERNEL_META=${E2E_KERNEL_META:-linux-image-6.12-amd64}
	kernel_fetch
	initramfs_base
	LAYER=$WORK/transports.cpio
	transports_layer "$LAYER"
fi
accel_pick
CONSOLE=$WORK/transports.console
SERIAL=$WORK/transports.results
GUEST_INITRD=$WORK/guest.cpio
# The kernel reads an uncompressed cpio after a compressed one only from a
# 4-byte boundary: the base is padded to one, or the layer goes unread
# whenever the base's length happens not to be a multiple of 4.
cp "$INITRD" "$GUEST_INITRD"
truncate -s %4 "$GUEST_INITRD"
cat "$LAYER" >>"$GUEST_INITRD"

# The traces' counts, from the archive (the guest's copy), and every
# device's size: the largest extent, in whole MiB, at least 64 and the
# QD1 region.
TRACES=${TRANSPORTS_TRACES:-}
python3 - "$LAYER" "$WORK" <<'EOF' || die "cannot read the traces' counts from $LAYER"
# The .env files of a newc cpio archive (no cpio on a bundle's machine).
import os, sys
data, out = open(sys.argv[1], "rb").read(), sys.argv[2]
i = 0
while i + 110 <= len(data):
    h = data[i:i + 110]
    assert h[:6] == b"070701", "not a newc cpio archive"
    size, nlen = int(h[54:62], 16), int(h[94:102], 16)
    name = data[i + 110:i + 110 + nlen - 1].decode()
    j = (i + 110 + nlen + 3) & ~3
    if name == "TRAILER!!!":
        break
    name = name[2:] if name.startswith("./") else name
    if name.startswith("etc/transports/") and name.endswith(".env"):
        os.makedirs(os.path.join(out, "etc/transports"), exist_ok=True)
        open(os.path.join(out, name), "wb").write(data[j:j + size])
    i = (j + size + 3) & ~3
EOF
[ -n "$TRACES" ] || TRACES=$(cd "$WORK/etc/transports" && ls *.env | sed 's/\.env$//' | paste -sd ' ')
for t in $TRACES; do
	[ -f "$WORK/etc/transports/$t.env" ] || die "no trace $t (there are: $(cd "$WORK/etc/transports" && ls *.env | sed 's/\.env$//' | tr '\n' ' '))"
done
if [ -n "${TRANSPORTS_SIZE:-}" ]; then
	SIZE_MIB=${TRANSPORTS_SIZE%MiB}
else
	SIZE_MIB=$(cat "$WORK"/etc/transports/*.env | awk -v q="$QD1_MIB" '{ for (i = 1; i <= NF; i++) if ($i ~ /^end=/) { e = substr($i, 5) + 0; if (e > m) m = e } }
		END { m = int((m + 1048575) / 1048576); if (m < 64) m = 64; if (m < q) m = q; print m }')
fi
[[ $SIZE_MIB =~ ^[0-9]+$ ]] || die "TRANSPORTS_SIZE=$TRANSPORTS_SIZE: MiB, a whole number (512 or 512MiB)"

csv() { echo "$*" | tr ' ' ','; }
params="e2e.mode=transports e2e.t_devices=$(csv $DEVICES) e2e.t_jobs=$(csv $JOBS) e2e.t_traces=$(csv $TRACES) e2e.t_repeat=$REPEAT e2e.t_iodepth=$IODEPTH e2e.t_rounds=$ROUNDS e2e.t_size=${SIZE_MIB}M e2e.t_zalg=$ZALG e2e.t_gargs=$GARGS e2e.t_qd1_mib=$QD1_MIB e2e.t_qd1_s=$QD1_S${TRANSPORTS_KCONNS:+ e2e.t_kconns=$TRANSPORTS_KCONNS} e2e.t_profile=${TRANSPORTS_PROFILE:-0} rootfstype=ramfs"
qemu_cmd "$MEM" "$SMP" "$params" -serial "file:$SERIAL"
log "transports: booting ($ACCEL, TCG thread=$E2E_TCG_THREAD, kernel $KVER, $SMP vCPUs, $MEM; devices $DEVICES; traces $TRACES; jobs $JOBS; repeat $REPEAT; rounds $ROUNDS; setup $((SECONDS - T0)) s)"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
ok=0
guest_run "$TIMEOUT" || ok=1
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
grep -aE '^E2E-(STEP: transports|TRANSPORTS|GZRAMD)' "$CONSOLE" | tr -d '\r' >&2 || true
cp "$CONSOLE" "$OUTDIR/console.log"
tr -d '\r' <"$SERIAL" >"$OUTDIR/results.raw"
[ "$ok" = 0 ] || die "transports: $GUEST_VERDICT (console in $OUTDIR/console.log)"
log "transports: the guest passed ($GUEST_WALL s)"
grep -a '^T-PROF ' "$OUTDIR/results.raw" | while read -r _ kind n data; do
	echo "$data" | base64 -d >"$OUTDIR/gzramd-$kind-$n.pprof" || log "transports: the profile of start $n ($kind) did not decode"
done

host_cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
python3 "$ROOT/bench/transports_report.py" "$OUTDIR/results.raw" "$WORK/etc/transports" "$OUTDIR" \
	"repeat=$REPEAT" "iodepth=$IODEPTH" "qd1_mib=$QD1_MIB" "qd1_s=$QD1_S" "smp=$SMP" "mem=$MEM" \
	"accel=$ACCEL" "tcg_thread=$E2E_TCG_THREAD" "size_mib=$SIZE_MIB" "zalg=$ZALG" "gargs=${GARGS//,/ }" \
	"guest_wall=$GUEST_WALL" "load0=$LOAD0" "load1=$LOAD1" "host=$NCPU CPUs ($host_cpu), kernel $(uname -r)" "date=$(date -u +%F)" \
	"gzramd=$("$GZRAMD" version 2>/dev/null | awk '{ print $NF; exit }')" \
	"command=TRANSPORTS_DEVICES=\"$DEVICES\" TRANSPORTS_TRACES=\"$TRACES\" TRANSPORTS_JOBS=\"$JOBS\" TRANSPORTS_REPEAT=$REPEAT TRANSPORTS_ROUNDS=$ROUNDS TRANSPORTS_SMP=$SMP TRANSPORTS_MEM=$MEM TRANSPORTS_QD1_MIB=$QD1_MIB TRANSPORTS_QD1_S=$QD1_S${E2E_BUNDLE:+ E2E_BUNDLE=...} bench/transports.sh" ||
	die "transports: the report failed (raw results in $OUTDIR/results.raw)"
log "transports: report in $OUTDIR/report.md, one line per measurement in $OUTDIR/results.txt (total $((SECONDS - T0)) s)"
