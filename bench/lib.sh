# Shared by the benchmark scripts that compare gzramd with kernel zram and
# nbdkit (bench/grid.sh): starting and stopping each target, running fio
# against it, and whole-machine CPU accounting. Source it; it sets a trap
# that stops what it started.
#
# Targets: gzramd-BACKEND[-ALGORITHM] (gzramd serve --backend cpu|gpu|auto
# --algorithm lz4|zstd, lz4 when not named, on a Unix socket, fio's nbd
# engine), zram[-ALGORITHM] (/dev/zram0 with lz4 or the algorithm named,
# fio's libaio engine with O_DIRECT; needs root), nbdkit (its memory plugin,
# fio's nbd engine; nbdkit@tcp and nbdkit@tls on loopback TCP, the latter
# with --tls=require and the certificates below).
#
# A gzramd target may end in +NAME, a variant for A/B runs: its binary is
# $GZRAMD_NAME and its flags $GZRAMD_ARGS_NAME where set (gzramd_variant).
# After that, @tcp serves it on loopback TCP and @tls on loopback TCP with
# TLS (a throwaway CA and server certificate, bench_tls_certs; libnbd's
# nbds:// URI), in place of the Unix socket: gzramd-cpu@tcp gzramd-cpu@tls.
#
# Environment: GZRAMD (default bin/gzramd), GZRAMD_ARGS (more serve flags),
# E2E_NBDKIT_MEMORY (the memory plugin: a name or a .so path),
# BENCH_SIZE (device size, default 2G), BENCH_REGION (what fio touches,
# default 1G).

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GZRAMD=${GZRAMD:-$BENCH_ROOT/bin/gzramd}
BENCH_SIZE=${BENCH_SIZE:-2G}
BENCH_REGION=${BENCH_REGION:-1G}
BENCH_EXPORT=gzram0
BENCH_PIDS=()
BENCH_TMPS=()
BENCH_ZRAM=""
BENCH_URI=""

bench_log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
bench_die() {
	bench_log "FATAL: $*"
	exit 1
}

bench_require() {
	local t
	for t in "$@"; do
		command -v "$t" >/dev/null || bench_die "$t missing (Debian package ${t/nbdkit/nbdkit}; on a GPU machine, the bundle of test/e2e/gpu-bundle.sh)"
	done
}

bench_cleanup() {
	local p
	for p in "${BENCH_PIDS[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${BENCH_PIDS[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	[ -z "$BENCH_ZRAM" ] || echo 1 >"$BENCH_ZRAM/reset" 2>/dev/null || true
	for p in "${BENCH_TMPS[@]}"; do
		rm -rf "$p"
	done
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# bench_workdir: sets WORK to a temporary directory removed at exit.
bench_workdir() {
	WORK=$(mktemp -d /tmp/gzramd-bench.XXXXXX)
	BENCH_TMPS+=("$WORK")
}

# machine_cpu_ticks: the machine's busy time so far, in clock ticks:
# user+nice+system+irq+softirq+steal of /proc/stat's cpu line (idle and
# iowait are not work). %.0f, not %d: mawk's %d stops at 2^31.
machine_cpu_ticks() {
	awk '$1 == "cpu" { printf "%.0f\n", $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# free_port: a TCP port nobody listens on now.
bench_free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# gzramd_variant TARGET: for a target named gzramd-...+NAME (an A/B
# variant), sets bin and args (locals of the caller) from GZRAMD_NAME and
# GZRAMD_ARGS_NAME, each defaulting to GZRAMD and GZRAMD_ARGS: e.g.
# GZRAMD_base=/tmp/old/gzramd with targets gzramd-gpu+base gzramd-gpu.
gzramd_variant() {
	case "$1" in
	*+*)
		local v=${1##*+}
		[[ $v =~ ^[A-Za-z0-9_]+$ ]] || bench_die "target $1: a variant name is letters, digits and _"
		eval "bin=\${GZRAMD_$v:-\$bin} args=\${GZRAMD_ARGS_$v:-\$args}"
		;;
	esac
}

# bench_tls_certs: writes a throwaway CA and a server certificate for
# 127.0.0.1 to $WORK/tls, once, in GnuTLS's layout that libnbd's
# tls-certificates= reads (ca-cert.pem), and the server's pair beside it.
bench_tls_certs() {
	local d=$WORK/tls
	[ -s "$d/server-key.pem" ] && return 0
	bench_require openssl
	mkdir -p "$d"
	(
		cd "$d"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
			-subj "/CN=gzramd bench CA" -keyout ca-key.pem -out ca-cert.pem
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
			-subj "/CN=gzramd bench" -keyout server-key.pem -out server.csr
		printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
		openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
			-days 2 -extfile server.ext -out server-cert.pem
	) >"$d/openssl.log" 2>&1 || bench_die "openssl could not make the TLS certificates: $(tail -3 "$d/openssl.log")"
}

# target_start TARGET: starts it; on failure sets BENCH_WHY (for a skip
# line) and returns 1. Sets BENCH_PID (0 for zram), BENCH_METRICS
# (gzramd) and BENCH_URI (the nbd engine's; empty for zram).
target_start() {
	local target=$1 sock log
	BENCH_PID=0
	BENCH_METRICS=""
	BENCH_URI=""
	case "$target" in
	gzramd-*)
		local name=${target%@*} transport=unix
		[ "$name" = "$target" ] || transport=${target##*@}
		local backend=${name#gzramd-} algorithm=lz4 bin=$GZRAMD args=${GZRAMD_ARGS:-}
		gzramd_variant "$name"
		backend=${backend%%+*}
		case "$transport" in
		unix) BENCH_URI="nbd+unix:///$BENCH_EXPORT?socket=$WORK/${target//+/_}.sock" ;;
		tcp | tls)
			local port
			port=$(bench_free_port)
			args="$args --tcp 127.0.0.1:$port"
			BENCH_URI="nbd://127.0.0.1:$port/$BENCH_EXPORT"
			if [ "$transport" = tls ]; then
				bench_tls_certs
				args="$args --tls-cert $WORK/tls/server-cert.pem --tls-key $WORK/tls/server-key.pem"
				BENCH_URI="nbds://127.0.0.1:$port/$BENCH_EXPORT?tls-verify-peer=false"
			fi
			;;
		*)
			BENCH_WHY="unknown transport @$transport (unix, tcp or tls)"
			return 1
			;;
		esac
		case "$backend" in
		*-*) algorithm=${backend#*-} backend=${backend%%-*} ;;
		esac
		[ -x "$bin" ] || { BENCH_WHY="$bin not built (make build)"; return 1; }
		sock=$WORK/${target//+/_}.sock log=$WORK/$target.log
		# The log of an earlier start would say "ready" before this daemon
		# has even truncated it.
		rm -f "$log"
		BENCH_METRICS=127.0.0.1:$(bench_free_port)
		# shellcheck disable=SC2086 # args is a list of flags
		"$bin" serve --size "$BENCH_SIZE" --socket "$sock" --export "$BENCH_EXPORT" \
			--metrics "$BENCH_METRICS" --backend "$backend" --algorithm "$algorithm" $args >"$log" 2>&1 &
		BENCH_PID=$!
		BENCH_PIDS+=("$BENCH_PID")
		for _ in $(seq 300); do
			grep -qs 'msg="gzramd ready"' "$log" && return 0
			if ! kill -0 "$BENCH_PID" 2>/dev/null; then
				BENCH_WHY=$(grep -E 'level=ERROR|^Error' "$log" | tail -1)
				[ -n "$BENCH_WHY" ] || BENCH_WHY=$(tail -1 "$log")
				return 1
			fi
			sleep 0.1
		done
		BENCH_WHY="did not come up in 30 s"
		return 1
		;;
	nbdkit | nbdkit@*)
		command -v nbdkit >/dev/null || { BENCH_WHY="nbdkit missing"; return 1; }
		local listen
		case "$target" in
		nbdkit)
			sock=$WORK/$target.sock
			BENCH_URI="nbd+unix:///$BENCH_EXPORT?socket=$sock"
			listen=(-U "$sock")
			;;
		nbdkit@tcp | nbdkit@tls)
			# The same client and loopback as gzramd's @tcp and @tls, so
			# that a ratio of nbdkit's (GnuTLS, no compression) tells
			# what the client and TLS cost whatever the server.
			local port
			port=$(bench_free_port)
			BENCH_URI="nbd://127.0.0.1:$port/$BENCH_EXPORT"
			listen=(-i 127.0.0.1 -p "$port")
			if [ "$target" = nbdkit@tls ]; then
				bench_tls_certs
				listen+=(--tls=require --tls-certificates="$WORK/tls")
				BENCH_URI="nbds://127.0.0.1:$port/$BENCH_EXPORT?tls-verify-peer=false"
			fi
			;;
		*)
			BENCH_WHY="unknown transport ${target#nbdkit} (unix, tcp or tls)"
			return 1
			;;
		esac
		# nbdkit writes its pid file once it accepts connections; its
		# socket appears at bind, before it listens, and stays after it
		# exits.
		rm -f "${sock:-}" "$WORK/$target.pid"
		nbdkit -f -P "$WORK/$target.pid" "${listen[@]}" "${E2E_NBDKIT_MEMORY:-memory}" "$BENCH_SIZE" >"$WORK/$target.log" 2>&1 &
		BENCH_PID=$!
		BENCH_PIDS+=("$BENCH_PID")
		for _ in $(seq 100); do
			[ -s "$WORK/$target.pid" ] && return 0
			kill -0 "$BENCH_PID" 2>/dev/null || break
			sleep 0.1
		done
		BENCH_WHY=$(cat "$WORK/$target.log")
		return 1
		;;
	zram | zram-*)
		local z=/sys/block/zram0 algorithm=lz4
		[ "$target" = zram ] || algorithm=${target#zram-}
		[ -d "$z" ] || { BENCH_WHY="no /dev/zram0 (modprobe zram)"; return 1; }
		[ "$(id -u)" = 0 ] || { BENCH_WHY="not root"; return 1; }
		echo 1 >"$z/reset" || { BENCH_WHY="cannot reset zram0 (in use?)"; return 1; }
		grep -qw "$algorithm" "$z/comp_algorithm" || { BENCH_WHY="zram has no $algorithm: $(cat "$z/comp_algorithm")"; return 1; }
		echo "$algorithm" >"$z/comp_algorithm"
		echo "$BENCH_SIZE" >"$z/disksize"
		BENCH_ZRAM=$z
		return 0
		;;
	*)
		BENCH_WHY="unknown target"
		return 1
		;;
	esac
}

target_stop() {
	case "$1" in
	zram | zram-*)
		echo 1 >"$BENCH_ZRAM/reset" || bench_log "zram0 did not reset"
		BENCH_ZRAM=""
		;;
	*)
		kill "$BENCH_PID" 2>/dev/null || true
		wait "$BENCH_PID" 2>/dev/null || true
		;;
	esac
}

# target_fio TARGET NAME FIO_ARGS...: one fio run against the target, with
# bench/e2e.sh's data (half compressible).
target_fio() {
	local target=$1 name=$2
	shift 2
	local io=(--ioengine=nbd --uri="$BENCH_URI")
	case "$target" in zram | zram-*) io=(--ioengine=libaio --direct=1 --filename=/dev/zram0) ;; esac
	fio --name="$name" "${io[@]}" --group_reporting \
		--buffer_compress_percentage=50 --buffer_compress_chunk=4096 "$@" ||
		bench_die "fio $name against $target failed"
}

# gzramd_metric NAME [LABELS]: a value from the running gzramd's /metrics.
gzramd_metric() {
	python3 - "$BENCH_METRICS" "$@" <<'EOF'
import sys, urllib.request
addr, name = sys.argv[1], sys.argv[2]
want = sys.argv[3] if len(sys.argv) > 3 else ""
body = urllib.request.urlopen("http://%s/metrics" % addr, timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(name + "{" if want else name + " ") and want in line:
        print(line.rsplit(" ", 1)[1])
        break
else:
    print(0)
EOF
}

# fio_summary JSON T0 T1 WALL RUNTIME: prints "MB/s IOPS CPU-s/GB p50-µs
# p99-µs" for a fio run of WALL seconds (ramp included) whose counted part
# was RUNTIME seconds, with machine_cpu_ticks T0 before and T1 after. The
# CPU of the ramp is in T1-T0 but its bytes are not in fio's totals: the
# ticks are scaled by RUNTIME/WALL to match. Latency is the completion
# latency of the direction that moved more.
fio_summary() {
	python3 - "$@" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
path, t0, t1, wall, runtime, tck = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
job = json.load(open(path))["jobs"][0]
r, w = job["read"], job["write"]
moved = r["io_bytes"] + w["io_bytes"]
main = r if r["io_bytes"] >= w["io_bytes"] else w
pct = main.get("clat_ns", {}).get("percentile", {})
cpu = (t1 - t0) / tck * runtime / wall
print("%.1f %.0f %.3f %.1f %.1f" % ((r["bw_bytes"] + w["bw_bytes"]) / 1e6, r["iops"] + w["iops"],
      cpu / (moved / 1e9) if moved else 0, pct.get("50.000000", 0) / 1e3, pct.get("99.000000", 0) / 1e3))
EOF
}

# fio_process_cpu JSON P0 P1: CPU-seconds per 10^9 bytes fio moved, of a
# process whose CPU-seconds were P0 before the run and P1 after.
fio_process_cpu() {
	python3 - "$@" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
moved = job["read"]["io_bytes"] + job["write"]["io_bytes"]
print("%.3f" % ((float(sys.argv[3]) - float(sys.argv[2])) / (moved / 1e9) if moved else 0))
EOF
}

# bench_machine: a line describing the machine, for the report.
bench_machine() {
	local cpu gpu
	cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
	gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
	echo "Machine: $(nproc) CPUs ($cpu)${gpu:+, $gpu}; kernel $(uname -r); $(date -u +%F); gzramd $("$GZRAMD" version 2>/dev/null | awk '{ print $NF; exit }')."
}

# bench_order ROUND TARGETS...: the targets, reversed in even rounds, so
# that a machine drifting over a run favours none of them.
bench_order() {
	local round=$1
	shift
	if [ $((round % 2)) = 1 ]; then
		echo "$@"
	else
		printf '%s\n' "$@" | tac | tr '\n' ' '
	fi
}

# bench_medians NKEYS FILE: FILE's rows are NKEYS key fields, a round
# number and values; prints each key's rows as one: the keys, the number
# of rounds, and the median of each value over the rounds (in the order
# the keys first appear).
bench_medians() {
	python3 - "$@" <<'EOF_PY'
import statistics, sys
nkeys, path = int(sys.argv[1]), sys.argv[2]
rows = {}
for line in open(path):
    f = line.split()
    if len(f) > nkeys + 1:
        rows.setdefault(tuple(f[:nkeys]), []).append([float(x) for x in f[nkeys + 1:]])
for key, vals in rows.items():
    meds = [statistics.median(col) for col in zip(*vals)]
    print(" ".join(key), len(vals), " ".join("%.6g" % m for m in meds))
EOF_PY
}

# bench_ratio_table FILE A/B...: FILE as for bench_medians with keys CASE
# TARGET. A markdown table with a row per case and, for each pair A/B, the
# median over the rounds of A's MB/s and CPU-s/GB (the first and third
# values) over B's in the same round: a ratio within a round is free of
# the drift between rounds. "-" where A or B did not run.
bench_ratio_table() {
	python3 - "$@" <<'EOF_PY'
import statistics, sys
path, pairs = sys.argv[1], [p.split("/") for p in sys.argv[2:]]
v, cases = {}, []
for line in open(path):
    f = line.split()
    if len(f) < 6:
        continue
    if f[0] not in cases:
        cases.append(f[0])
    v[(f[0], f[1], f[2])] = (float(f[3]), float(f[5]))
head = "| case |" + "".join(" %s/%s MB/s | %s/%s CPU |" % (a, b, a, b) for a, b in pairs)
print(head)
print("|---|" + "---:|" * (2 * len(pairs)))
for c in sorted(cases):
    row = "| %s |" % c
    for a, b in pairs:
        mb, cpu = [], []
        for (case, t, r), x in v.items():
            y = v.get((c, b, r))
            if case != c or t != a or y is None:
                continue
            if y[0] > 0:
                mb.append(x[0] / y[0])
            if y[1] > 0:
                cpu.append(x[1] / y[1])
        row += " %s | %s |" % ("%.2f" % statistics.median(mb) if mb else "-", "%.2f" % statistics.median(cpu) if cpu else "-")
    print(row)
EOF_PY
}
