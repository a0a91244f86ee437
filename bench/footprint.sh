#!/usr/bin/env bash
# bench/footprint.sh: what gzramd's own processes cost the machine in
# memory, against kernel zram's own cost and a bare CUDA context, and the
# swapped size from which gzramd saves more memory than zram (the
# net-saving arithmetic of docs/DESIGN.md, "Footprint").
#
# For each target and device size:
#   - idle: the machine's MemAvailable drop from before the start to when
#     every process is up (gzramd: the supervisor, the serving process and
#     its standby), caches dropped before each reading, median of
#     FOOTPRINT_STARTS starts; and each process's RSS, anonymous, locked
#     and shared memory and PSS (smaps_rollup), pinned memory (VmPin) and
#     GPU memory (nvidia-smi), from the median start; the processes' PSS
#     in all is a second measure of own memory, steady where MemAvailable
#     is not (a small or busy machine), without the kernel's memory for
#     them;
#   - stored: the same after writing FOOTPRINT_STORE of corpus pages (the
#     corpus repeated), plus mem_used_total; "own" is the drop less
#     mem_used_total;
#   - zram: its own memory is its table, VmallocUsed's rise when disksize
#     is set (MemAvailable's drop is in the raw file, as "avail");
#   - the net saving against each zram target: gzramd saves more memory
#     than zram once x bytes are swapped, x = (own_gzramd - own_zram) /
#     (1/ratio_zram - 1/ratio_gzramd), ratio being the bytes written /
#     mem_used_total, the same pages written to each (nbdcopy leaves out
#     zero pages, which orig_data_size then does not count); with
#     gzramd's own memory idle, and as it is with the data stored.
#
# Usage: bench/footprint.sh [TARGET...]
#        bench/footprint.sh --report RAW   (the report of a run's raw readings)
#   TARGET: gzramd-BACKEND-ALGORITHM (gzramd-cpu-lz4, gzramd-gpu-zstd, ...),
#   zram-ALGORITHM (zram-lzo-rle, zram-lz4), cuda-context (a bare CUDA
#   context: bench/gpu/ctxmem.c, built here with cc). Default: gzramd-cpu
#   with lz4 and zstd, with the GPU too where nvidia-smi sees one, zram
#   with lzo-rle and lz4, and cuda-context where there is a GPU.
#
# Environment:
#   FOOTPRINT_SIZES   device sizes (default "1GiB 8GiB")
#   FOOTPRINT_STARTS  starts per target and size (default 3)
#   FOOTPRINT_STORE   corpus bytes stored after the last start (default
#                     1GiB, at most 3/4 of the device; 0: idle only)
#   FOOTPRINT_OUT     also write the report (markdown) to this file
#   FOOTPRINT_RAW     keep the raw readings (a line each) in this file, as
#                     they are taken (--report makes the report of them)
#   FOOTPRINT_LOGS    append every gzramd start's log to this file, and
#                     each process's resident memory by mapping
#   FOOTPRINT_SETTLE  most seconds to wait for MemAvailable to hold still
#                     before a reading (20)
#   FOOTPRINT_CTXMEM  a built bench/gpu/ctxmem (default: built into the
#                     work directory with cc)
#   GZRAMD_CORPUS     memory-pages.bin.zst (default ../shared/corpus/)
#   GZRAMD, GZRAMD_ARGS: as for bench/lib.sh, which also says how a
#   target named gzramd-...+NAME runs another binary or other flags (A/B)
# Needs root (drop_caches, zram), python3, zstd, and nbdcopy to store
# (Debian's libnbd-bin; on a GPU machine, test/e2e/gpu-bundle.sh's bundle).
# Run it on a quiet machine: MemAvailable is the whole machine's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"

SIZES=${FOOTPRINT_SIZES:-1GiB 8GiB}
STARTS=${FOOTPRINT_STARTS:-3}
STORE=${FOOTPRINT_STORE:-1GiB}
CORPUS=${GZRAMD_CORPUS:-$ROOT/../shared/corpus/memory-pages.bin.zst}

if [ "${1:-}" = --report ]; then
	[ -r "${2:-}" ] || bench_die "--report needs the raw file of a run (FOOTPRINT_RAW)"
	RAW=$2 REPORT_ONLY=1
fi
[ -n "${REPORT_ONLY:-}" ] || [ "$(id -u)" = 0 ] || bench_die "footprint needs root: it drops the page cache before each reading, and uses /dev/zram0"
bench_require python3
bench_workdir
if [ -z "${REPORT_ONLY:-}" ]; then
	RAW=${FOOTPRINT_RAW:-$WORK/raw}
	: >"$RAW"
fi

have_gpu() { nvidia-smi -L >/dev/null 2>&1; }

if [ $# -gt 0 ]; then
	TARGETS="$*"
else
	TARGETS="gzramd-cpu-lz4 gzramd-cpu-zstd"
	have_gpu && TARGETS+=" gzramd-gpu-lz4 gzramd-gpu-zstd"
	TARGETS+=" zram-lzo-rle zram-lz4"
	have_gpu && TARGETS+=" cuda-context"
fi

# bytes SIZE: SIZE (1GiB, 512MiB, 4096) in bytes.
bytes() {
	python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)\s*([KMGT]i?B?|)", sys.argv[1])
if not m: sys.exit("footprint: bad size " + sys.argv[1])
print(int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2][:1]])' "$1"
}

mem_available() { awk '/^MemAvailable:/ { print $2 }' /proc/meminfo; }
vmalloc_used() { awk '/^VmallocUsed:/ { print $2 }' /proc/meminfo; }

# quiesce: drop clean caches, so that MemAvailable moves only with what
# processes hold, and wait until it holds still: after a process ends or
# the caches are dropped, the kernel goes on freeing memory for seconds
# (on a 2-core VM, MemFree rose 24 MiB over 20 s with nothing running),
# which would count against whatever starts next. Until it moves by
# under 1 MiB a second for 2 s, at most FOOTPRINT_SETTLE seconds (20; on
# the H100 machine MemAvailable never holds that still).
quiesce() {
	local last now still=0
	sync
	echo 3 >/proc/sys/vm/drop_caches
	last=$(mem_available)
	for _ in $(seq "${FOOTPRINT_SETTLE:-20}"); do
		sleep 1
		now=$(mem_available)
		if [ $((now > last ? now - last : last - now)) -lt 1024 ]; then
			still=$((still + 1))
			[ "$still" -ge 2 ] && return 0
		else
			still=0
		fi
		last=$now
	done
	bench_log "MemAvailable still moved by 1 MiB a second after ${FOOTPRINT_SETTLE:-20} s: this reading is noisy"
}

# proc_row TARGET SIZE STATE RUN ROLE PID: one row of a process's memory
# (KiB) into RAW.
proc_row() {
	local pid=$6 gpu=0
	[ -r "/proc/$pid/smaps_rollup" ] || return 0
	if have_gpu; then
		gpu=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
			awk -F', *' -v p="$pid" '$1 == p { print $2 * 1024 }')
	fi
	awk -v head="proc $1 $2 $3 $4 $5" -v gpu="${gpu:-0}" '
		FILENAME ~ /smaps_rollup/ && /^(Rss|Pss|Anonymous|Locked|Pss_Shmem):/ { v[$1] = $2 }
		FILENAME ~ /status/ && /^VmPin:/ { v[$1] = $2 }
		END { printf "%s %d %d %d %d %d %d %d\n", head, v["Rss:"], v["Anonymous:"], v["Locked:"], v["Pss_Shmem:"], v["VmPin:"], gpu, v["Pss:"] }
	' "/proc/$pid/smaps_rollup" "/proc/$pid/status" >>"$RAW"
}

# maps_summary PID: the process's resident memory by mapping (the file,
# or [anon], [heap], ...), largest first, 256 KiB and more.
maps_summary() {
	awk '
		/^[0-9a-f]+-[0-9a-f]+ / { name = $6 ? $6 : "[anon]"; for (i = 7; i <= NF; i++) name = name " " $i }
		/^Rss:/ { rss[name] += $2 }
		END { for (n in rss) if (rss[n] >= 256) printf "  %8d KiB %s\n", rss[n], n }
	' "/proc/$1/smaps" 2>/dev/null | sort -rn
}

# gzramd_procs SUPERVISOR: "ROLE PID" for the supervisor and each child.
gzramd_procs() {
	local sup=$1 c
	echo "supervisor $sup"
	for c in $(pgrep -P "$sup" || true); do
		if tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -q '^GZRAMD_STANDBY='; then
			echo "standby $c"
		else
			echo "serving $c"
		fi
	done
}

# wait_log FILE PATTERN SECONDS PID: until FILE has PATTERN; fails when PID
# dies or the time is up.
wait_log() {
	local i
	for i in $(seq $(($3 * 10))); do
		grep -qs "$2" "$1" && return 0
		kill -0 "$4" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# data_file BYTES: WORK/data.bin, BYTES of corpus pages (the corpus
# repeated), made once.
data_file() {
	local want=$1
	[ -s "$WORK/data.bin" ] && [ "$(stat -c %s "$WORK/data.bin")" = "$want" ] && return 0
	bench_require zstd
	zstd -dqf "$CORPUS" -o "$WORK/pages.bin"
	: >"$WORK/data.bin"
	while [ "$(stat -c %s "$WORK/data.bin")" -lt "$want" ]; do
		cat "$WORK/pages.bin" >>"$WORK/data.bin"
	done
	truncate -s "$want" "$WORK/data.bin"
	rm -f "$WORK/pages.bin"
}

# store_bytes SIZE: what to store on a device of SIZE bytes: FOOTPRINT_STORE,
# at most 3/4 of the device, in whole pages; 0 without a corpus.
store_bytes() {
	local want
	want=$(bytes "$STORE")
	[ "$want" -gt 0 ] || { echo 0; return; }
	[ -r "$CORPUS" ] || { echo 0; return; }
	want=$(( want < $1 * 3 / 4 ? want : $1 * 3 / 4 ))
	echo $((want / 4096 * 4096))
}

run_gzramd() {
	local target=$1 size=$2 run=$3 store=$4
	local backend=${target#gzramd-} algorithm bin=$GZRAMD args=${GZRAMD_ARGS:-}
	gzramd_variant "$target"
	backend=${backend%%+*}
	algorithm=${backend#*-} backend=${backend%%-*}
	local sock=$WORK/gz.sock log=$WORK/$target-$size-$run.log before after pid metrics
	quiesce
	before=$(mem_available)
	metrics=127.0.0.1:$(bench_free_port)
	# shellcheck disable=SC2086 # args is a list of flags
	"$bin" serve --size "$(bytes "$size")" --socket "$sock" --export "$BENCH_EXPORT" --metrics "$metrics" \
		--backend "$backend" --algorithm "$algorithm" $args >"$log" 2>&1 &
	pid=$!
	BENCH_PIDS+=("$pid")
	if ! wait_log "$log" 'msg="gzramd ready"' 60 "$pid"; then
		bench_log "$target $size: did not start: $(grep -E 'level=ERROR|^gzramd:' "$log" | tail -1)"
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		return 1
	fi
	case " $args " in
	*" --standby=false "* | *" --supervise=false "*) ;;
	*) wait_log "$log" 'standby: started ahead' 60 "$pid" || bench_log "$target $size: no standby came up" ;;
	esac
	quiesce
	after=$(mem_available)
	echo "drop $target $size idle $run $((before - after))" >>"$RAW"
	local role p
	while read -r role p; do
		proc_row "$target" "$size" idle "$run" "$role" "$p"
		[ -z "${FOOTPRINT_LOGS:-}" ] || { echo "=== $target $size start $run: $role (pid $p), resident by mapping"; maps_summary "$p"; } >>"$FOOTPRINT_LOGS"
	done < <(gzramd_procs "$pid")
	if [ "$store" -gt 0 ]; then
		bench_require nbdcopy
		data_file "$store"
		nbdcopy "$WORK/data.bin" "nbd+unix:///$BENCH_EXPORT?socket=$sock"
		BENCH_METRICS=$metrics
		for _ in $(seq 300); do
			[ "$(gzramd_metric gzramd_staged_pages)" = 0 ] && break
			sleep 0.1
		done
		local orig used
		orig=$(gzramd_metric gzramd_orig_data_bytes)
		used=$(gzramd_metric gzramd_mem_used_bytes)
		quiesce
		after=$(mem_available)
		echo "drop $target $size stored $run $((before - after))" >>"$RAW"
		echo "store $target $size $run $store $used $orig" >>"$RAW"
		while read -r role p; do proc_row "$target" "$size" stored "$run" "$role" "$p"; done < <(gzramd_procs "$pid")
	fi
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	[ -z "${FOOTPRINT_LOGS:-}" ] || { echo "=== $target $size start $run"; cat "$log"; } >>"$FOOTPRINT_LOGS"
}

run_zram() {
	local target=$1 size=$2 run=$3 store=$4 alg=${1#zram-} z=/sys/block/zram0 before after
	[ -d "$z" ] || { bench_log "$target: no /dev/zram0 (modprobe zram)"; return 1; }
	echo 1 >"$z/reset" || { bench_log "$target: cannot reset zram0 (in use?)"; return 1; }
	grep -qw "$alg" "$z/comp_algorithm" || { bench_log "$target: zram has no $alg"; return 1; }
	BENCH_ZRAM=$z
	# zram's own memory is its table (16 bytes a page), made with vmalloc
	# when disksize is set: VmallocUsed's rise is exact, where
	# MemAvailable moves by as much on its own on some machines.
	local vbefore vafter
	quiesce
	before=$(mem_available) vbefore=$(vmalloc_used)
	echo "$alg" >"$z/comp_algorithm"
	bytes "$size" >"$z/disksize"
	vafter=$(vmalloc_used)
	quiesce
	after=$(mem_available)
	echo "drop $target $size idle $run $((vafter - vbefore))" >>"$RAW"
	echo "avail $target $size idle $run $((before - after))" >>"$RAW"
	if [ "$store" -gt 0 ]; then
		data_file "$store"
		dd if="$WORK/data.bin" of=/dev/zram0 bs=1M oflag=direct status=none
		sync
		local orig used
		read -r orig _ used _ <"$z/mm_stat"
		quiesce
		after=$(mem_available)
		echo "drop $target $size stored $run $((before - after))" >>"$RAW"
		echo "store $target $size $run $store $used $orig" >>"$RAW"
	fi
	echo 1 >"$z/reset"
	BENCH_ZRAM=""
}

# run_context RUN: a bare CUDA context, as gzramd makes it (the primary
# context, blocking sync), in a process of its own.
run_context() {
	local run=$1 out
	if [ -z "${CTXMEM:-}" ]; then
		CTXMEM=${FOOTPRINT_CTXMEM:-$WORK/ctxmem}
		[ -x "$CTXMEM" ] || cc -O2 -o "$CTXMEM" "$ROOT/bench/gpu/ctxmem.c" -ldl ||
			{ bench_log "cuda-context: cannot build bench/gpu/ctxmem.c"; return 1; }
	fi
	quiesce
	out=$("$CTXMEM" --flags 4) || { bench_log "cuda-context: $out"; return 1; }
	echo "$out" | awk -v run="$run" '/^primary context/ {
		# "key=  value" pairs, the value padded
		for (i = 1; i <= NF; i++) if ($i ~ /=/) { split($i, kv, "="); v[kv[1]] = kv[2] != "" ? kv[2] : $(i + 1) }
		printf "drop cuda-context - idle %s %d\n", run, v["avail_drop"]
		printf "proc cuda-context - idle %s process %d %d %d %d 0 0\n", run, v["rss"], v["anon"], v["locked"], v["shmem"]
	}' >>"$RAW"
}

for size in $SIZES; do
	[ -z "${REPORT_ONLY:-}" ] || break
	for target in $TARGETS; do
		case $target in cuda-context) [ "$size" = "${SIZES%% *}" ] || continue ;; esac
		store=$(store_bytes "$(bytes "$size")")
		for run in $(seq "$STARTS"); do
			s=0
			[ "$run" = "$STARTS" ] && s=$store
			msg=""; [ "$s" -gt 0 ] && msg=", then $s bytes stored"
			bench_log "$target $size: start $run of $STARTS$msg"
			case $target in
			gzramd-*) run_gzramd "$target" "$size" "$run" "$s" || break ;;
			zram-*) run_zram "$target" "$size" "$run" "$s" || break ;;
			cuda-context) run_context "$run" || break ;;
			*) bench_die "unknown target $target" ;;
			esac
		done
	done
done
[ -n "${REPORT_ONLY:-}" ] || [ -r "$CORPUS" ] || bench_log "no corpus at $CORPUS (set GZRAMD_CORPUS): nothing stored, no net saving"

report() {
	bench_machine
	echo
	echo "gzramd: $GZRAMD ${GZRAMD_ARGS:-}; $STARTS starts per row, the median's processes shown; stored: ${STORE} of corpus pages (at most 3/4 of the device). MiB."
	echo
	python3 - "$RAW" <<'EOF_PY'
import statistics, sys
drops, procs, stores = {}, {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "drop":
        drops.setdefault(tuple(f[1:4]), []).append((int(f[5]), f[4]))
    elif f[0] == "proc":
        procs.setdefault(tuple(f[1:5]), []).append([f[5]] + [int(x) for x in f[6:]])
    elif f[0] == "store":
        # written, mem_used_total (and orig_data_size, which leaves out
        # what nbdcopy skips as zeroes)
        stores[tuple(f[1:3])] = (int(float(f[4])), int(float(f[5])))
mib = lambda kib: "%.1f" % (kib / 1024)
print("| target | size | state | MemAvailable drop | process | RSS | anon | locked | shmem | pinned | GPU | PSS |")
print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
own, own_stored = {}, {}
# The processes' PSS summed: their memory, shared pages counted once,
# steady where MemAvailable is not (a busy or small machine); it leaves
# out the kernel's memory for them (page tables, stacks, the GPU
# driver's).
pss, pss_stored = {}, {}
pss_of = lambda rows: sum(r[7] for r in rows) if rows and all(len(r) > 7 for r in rows) else None
for (t, size, state), runs in drops.items():
    vals = sorted(runs)
    med, run = vals[(len(vals) - 1) // 2] if state == "idle" else vals[-1]
    if state == "idle":
        own[(t, size)] = med
    label = mib(med) if state == "idle" else mib(med)
    note = " (median of %d)" % len(vals) if state == "idle" and len(vals) > 1 else ""
    rows = procs.get((t, size, state, run), [])
    if not rows:
        print("| %s | %s | %s | %s%s | | | | | | | | |" % (t, size, state, label, note))
    for i, r in enumerate(rows):
        head = "| %s | %s | %s | %s%s |" % (t, size, state, label, note) if i == 0 else "| | | | |"
        cells = [mib(x) for x in r[1:8]] + [""] * (7 - len(r[1:8]))
        print(head + " %s | %s |" % (r[0], " | ".join(cells)))
    p = pss_of(rows)
    if p is not None and state == "idle":
        # The median over the starts, not the median start's: that one
        # is picked by MemAvailable.
        all_p = sorted(x for x in (pss_of(procs.get((t, size, state, r), [])) for _, r in runs) if x is not None)
        p = all_p[(len(all_p) - 1) // 2]
        pss[(t, size)] = p
        print("| | | | | processes' PSS in all %s%s | | | | | | | |" % (mib(p), " (median of %d)" % len(all_p) if len(all_p) > 1 else ""))
    if state == "stored" and (t, size) in stores:
        orig, used = stores[(t, size)]
        own_stored[(t, size)] = med - used / 1024
        extra = ""
        if p is not None:
            pss_stored[(t, size)] = p - used / 1024
            extra = "; PSS in all %s, less mem_used %s" % (mib(p), mib(p - used / 1024))
        print("| | | | | written %s, mem_used_total %s: ratio %.3f; own (drop - mem_used) %s%s | | | | | | | |" % (
            mib(orig / 1024), mib(used / 1024), orig / used if used else 0, mib(med - used / 1024), extra))
print()
zrams = sorted({t for (t, _) in own if t.startswith("zram-")})
gzs = sorted({t for (t, _) in own if t.startswith("gzramd-")})
ctx = [v for (t, _), v in own.items() if t == "cuda-context"]
if ctx:
    print("A bare CUDA context (primary context, blocking sync, nothing loaded): %s MiB of MemAvailable." % mib(ctx[0]))
    print()
def net_saving(title, owns):
    print(title)
    print()
    print("| gzramd | size | own | ratio | " + " | ".join("vs %s (own, ratio)" % z for z in zrams) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(zrams))
    for g in gzs:
        for (t, size), o in owns.items():
            if t != g or (g, size) not in stores:
                continue
            orig, used = stores[(g, size)]
            rg = orig / used
            cells = []
            for z in zrams:
                if (z, size) not in own or (z, size) not in stores:
                    cells.append("-")
                    continue
                oz = own[(z, size)]
                zo, zu = stores[(z, size)]
                rz = zo / zu
                d, k = (o - oz) * 1024, 1 / rz - 1 / rg
                if d <= 0 and k >= 0:
                    x = "from 0"
                elif k <= 0:
                    x = "never" if d > 0 else "up to %.2f GiB" % (d / k / 2**30)
                else:
                    x = "%.2f GiB" % (d / k / 2**30)
                cells.append("%s (%s, %.3f)" % (x, mib(oz), rz))
            print("| %s | %s | %s | %.3f | %s |" % (g, size, mib(o), rg, " | ".join(cells)))
    print()
if zrams and gzs:
    net_saving("Net saving: gzramd saves more memory than zram from this much swapped (own: gzramd's idle drop, zram's table; ratio: bytes written / mem_used_total, the same pages written to each).", own)
    net_saving("The same with gzramd's own memory as it is with the data stored (its drop then, less mem_used_total).", {k: v for k, v in own_stored.items() if k[0].startswith("gzramd-")})
    if pss:
        net_saving("The same with gzramd's own memory as its processes' PSS in all, idle (steady where MemAvailable is not; without the kernel's memory for them).", {k: v for k, v in pss.items() if k[0].startswith("gzramd-")})
    if pss_stored:
        net_saving("And with their PSS with the data stored, less mem_used_total.", {k: v for k, v in pss_stored.items() if k[0].startswith("gzramd-")})
EOF_PY
}
report | tee "${FOOTPRINT_OUT:-/dev/null}"
