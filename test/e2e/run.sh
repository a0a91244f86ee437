#!/usr/bin/env bash
# End-to-end test: Debian's kernel in QEMU swaps through an NBD server and a
# memory hog verifies every word it wrote, twice.
#
# Scenarios (E2E_SCENARIOS, space-separated, default "host-1 host-2 guest survive-fast"):
#   host-1  server on the host, guest nbd-client -swap, 1 vCPU, 1 connection
#   host-2  the same with 2 vCPUs and nbd-client -C 2
#   host-tls host-1 over TLS with certificates both ways: a throwaway CA,
#           gzramd serve --tls-cert/--tls-key/--tls-ca (TLS only), the
#           guest's nbd-client -certfile/-keyfile/-cacertfile (its forked
#           proxy encrypts for the kernel's socket); gzramd must name the
#           guest's certificate (log, gzramd status, metrics). gzramd only.
#   guest   gzramd inside the guest: `gzramd serve --swap --device /dev/nbd0`
#           attaches, mkswaps and swapons itself; a clean stop must swapoff.
#           Skipped (with a message) while the binary has no --swap flag,
#           unless E2E_REQUIRE_GUEST=1.
#   survive gzramd inside the guest as in guest, its serving process
#           SIGKILLed >= 20 times while the hog runs (killer.c); every kill
#           must be taken over with nothing lost (survive.py, README.md).
#           survive-fast: 3-10 kills (a default scenario); survive-control:
#           survival off (--kernel-dead-timeout=-1s), must fail
#           (make test-survive); survive-zstd: survive-fast with
#           --algorithm zstd --object-pages 4; survive-objects: survive-fast with
#           --object-pages 8; survive-dense: survive-fast with the dense
#           tier recompressing groups idle for 1 s; survive-mutant:
#           survive-fast with a faults
#           build losing a page at each takeover, must fail
#           (survive-mutant.sh); survive-ublk: survive-fast over ublk
#           (--transport ublk, a 6.12 guest): each takeover is ublk user
#           recovery; survive-control-ublk, survive-mutant-ublk: the
#           control and the mutant over ublk. E2E_SURVIVE_ARGS adds gzramd flags.
#   guest-ublk gzramd inside a 6.12 guest as in guest, over ublk:
#           `gzramd serve --swap --transport ublk --supervise=false`
#           creates /dev/ublkbN, mkswaps and swapons it; /status and the
#           metrics must say ublk; a clean stop must swapoff and remove
#           the device. Not a default scenario yet.
#   ublk    pkg/ublk's tests in a 6.12 guest with ublk_drv (go test -c):
#           a device served from memory through ublk, not NBD; not a
#           default scenario (it takes the 6.12 kernel for every scenario
#           of its run), CI runs it in a run of its own (issue 38)
#   systemd deploy/systemd/gzramd.service under a real systemd: a Debian
#           guest with systemd as init (test/e2e/systemd.sh, its own
#           runner). Slow, so not among the defaults (make test-systemd).
#   systemd-ublk  the same with GZRAMD_TRANSPORT=ublk in the unit's env
#           file, on 6.12 (make test-systemd-ublk).
# Environment:
#   E2E_SERVER=gzramd|nbdkit   the host-side server (default gzramd)
#   E2E_EXPECT_FAIL=1          the server corrupts data on purpose (e.g.
#                              GZRAMD_FAULT_CORRUPT_READS=1): every host
#                              scenario must end with the hog finding wrong
#                              words; passing is then the failure.
#   E2E_ACCEL=kvm|tcg          skip the KVM probe
#   E2E_GUEST_MEM, E2E_HOG_MIB guest RAM (default 128M) and hog size (200)
#   E2E_TIMEOUT                seconds per guest before it counts as hung
#                              (default 300; a passing guest takes 15-90 s);
#                              E2E_GUEST_TIMEOUT for guest (twice that)
#   GZRAMD                     the daemon binary (default bin/gzramd)
#   E2E_GZRAMD_ARGS            more flags for the host-side gzramd serve
#   E2E_TLS_GUARD              host-tls: what guards nbd-client's TLS
#                              proxy, of flusher,cgroup,ramfs (1, the
#                              default: all three; 0: none, as a user
#                              runs it, which deadlocks: README.md)
#   E2E_RECORD_TRACE=DIR       the host-side gzramd records the requests
#                              of each host scenario as a fio iolog,
#                              DIR/<scenario>.iolog (serve --record-trace),
#                              to replay with bench/trace.sh
#   E2E_BUNDLE=FILE|DIR        QEMU, its firmware, the guest kernel and the
#                              initramfs (and gzramd, if it carries one)
#                              from a bundle made by gpu-e2e-bundle.sh, for a
#                              machine without Debian's packages: no package
#                              is installed, nothing downloaded or built;
#                              the scenarios default to host-1 host-2
#   E2E_NO_DEPS=1              do not run deps.sh (tools come on PATH)
# With gzramd, each host scenario ends by reporting which share of the
# compressed pages the GPU compressed (gzramd_compressed_pages_total).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

SERVER=${E2E_SERVER:-gzramd}
if [ -n "${E2E_BUNDLE:-}" ]; then
	bundle_open
	[ -z "$GZRAMD_FILE" ] || GZRAMD=${GZRAMD:-$E2E_BUNDLE/$GZRAMD_FILE}
	# The guest scenario builds an initramfs with gzramd and util-linux
	# from this machine's files, which a bundle does not carry.
	SCENARIOS=${E2E_SCENARIOS:-host-1 host-2}
	[[ " $SCENARIOS " != *" guest "* ]] ||
		die "the guest scenario cannot run from a bundle (E2E_SCENARIOS=\"host-1 host-2\")"
else
	SCENARIOS=${E2E_SCENARIOS:-host-1 host-2 guest survive-fast}
fi
GUEST_MEM=${E2E_GUEST_MEM:-128M}
HOG_MIB=${E2E_HOG_MIB:-200}
TIMEOUT=${E2E_TIMEOUT:-300}
EXPECT_FAIL=${E2E_EXPECT_FAIL:-0}
GZRAMD=${GZRAMD:-$E2E_ROOT/bin/gzramd}
SIZE=512MiB
EXPORT=gzram0

if [ "${E2E_NO_DEPS:-0}" != 1 ] && [ -z "${E2E_BUNDLE:-}" ]; then
	"$E2E_DIR/deps.sh"
fi
command -v nbdkit >/dev/null || [ "$SERVER" != nbdkit ] || die "nbdkit missing"
case "$SERVER" in
gzramd) [ -x "$GZRAMD" ] || [ "$SCENARIOS" = ublk ] || die "$GZRAMD not built (make build)" ;;
nbdkit) ;;
*) die "E2E_SERVER must be gzramd or nbdkit, not $SERVER" ;;
esac

mkdir -p "$E2E_CACHE"
e2e_workdir /tmp/gzramd-e2e.XXXXXX "consoles and logs"
T0=$SECONDS
# ublk needs a kernel with ublk_drv and USER_COPY: Debian 12's 6.12, not
# its default 6.1. Where the scenario runs and no kernel is named, that one
# (for every scenario of the run).
if [[ " $SCENARIOS " == *" ublk "* || " $SCENARIOS " == *"-ublk "* || " $SCENARIOS " == *"-ublk-"* ]] && [ -z "${E2E_KERNEL_META:-}" ] && [ -z "${E2E_BUNDLE:-}" ]; then
	export E2E_KERNEL_META=linux-image-6.12-amd64
	log "ublk: kernel $E2E_KERNEL_META"
fi
if [ -n "${E2E_BUNDLE:-}" ]; then
	bundle_kernel
else
	kernel_fetch
	initramfs_base
fi
accel_pick
log "kernel $KVER, accel $ACCEL, server $SERVER, guest ${GUEST_MEM} RAM, hog ${HOG_MIB} MiB (setup $((SECONDS - T0)) s)"

# tls_certs DIR: a throwaway CA (ca-cert.pem), a server certificate for
# 10.0.2.2, the host as the guest reaches it and as nbd-client checks it
# (its -tlshostname defaults to the host it connects to), and a client
# certificate named $TLS_CLIENT, each with its key (NAME-key.pem), in DIR.
TLS_CLIENT=e2e-guest
tls_certs() {
	local dir=$1 name cn ext
	mkdir -p "$dir"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
		-subj /CN=gzramd-e2e-ca -addext basicConstraints=critical,CA:TRUE \
		-addext keyUsage=critical,keyCertSign,cRLSign \
		-keyout "$dir/ca-key.pem" -out "$dir/ca-cert.pem" 2>/dev/null || die "openssl: the CA"
	for name in server client; do
		if [ "$name" = server ]; then
			cn=10.0.2.2 ext=$'subjectAltName=IP:10.0.2.2\nextendedKeyUsage=serverAuth'
		else
			cn=$TLS_CLIENT ext=extendedKeyUsage=clientAuth
		fi
		openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
			-keyout "$dir/$name-key.pem" -out "$dir/$name.csr" 2>/dev/null &&
			openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca-cert.pem" -CAkey "$dir/ca-key.pem" \
				-set_serial "$RANDOM$RANDOM" -days 2 -extfile <(echo "$ext") \
				-out "$dir/$name-cert.pem" 2>/dev/null || die "openssl: the $name certificate"
	done
}

SERVER_PID=
# server_start NAME [TLS-DIR]: starts $SERVER on 127.0.0.1:$PORT (and
# gzramd's metrics on $MPORT) and waits until it accepts connections; with
# TLS-DIR (tls_certs), over TLS only, clients' certificates required.
server_start() {
	PORT=$(free_port)
	SERVER_LOG=$WORK/$1.server.log
	case "$SERVER" in
	gzramd)
		MPORT=$(free_port)
		local trace=() tls=()
		[ -z "${2:-}" ] || tls=(--tls-cert "$2/server-cert.pem" --tls-key "$2/server-key.pem" --tls-ca "$2/ca-cert.pem")
		if [ -n "${E2E_RECORD_TRACE:-}" ]; then
			mkdir -p "$E2E_RECORD_TRACE"
			trace=(--record-trace "$E2E_RECORD_TRACE/$1.iolog")
			log "$1: recording the requests in $E2E_RECORD_TRACE/$1.iolog"
		fi
		"$GZRAMD" serve --tcp "127.0.0.1:$PORT" --size "$SIZE" --export "$EXPORT" \
			--socket "$WORK/gzramd.sock" --metrics "127.0.0.1:$MPORT" \
			"${trace[@]}" "${tls[@]}" ${E2E_GZRAMD_ARGS:-} >"$SERVER_LOG" 2>&1 &
		;;
	nbdkit)
		MPORT=
		nbdkit -f -i 127.0.0.1 -p "$PORT" memory "${SIZE%iB}" >"$SERVER_LOG" 2>&1 &
		;;
	esac
	SERVER_PID=$!
	E2E_PIDS+=("$SERVER_PID")
	# gzramd says when it is ready; probing its port would log a failed
	# handshake.
	if [ "$SERVER" = gzramd ]; then
		wait_log "$SERVER_LOG" 'gzramd ready' 20 "$SERVER_PID"
	else
		wait_port 127.0.0.1 "$PORT" 20 "$SERVER_PID"
	fi || {
		cat "$SERVER_LOG" >&2
		die "$SERVER did not listen on 127.0.0.1:$PORT"
	}
}

server_stop() {
	kill "$SERVER_PID" 2>/dev/null || true
	local rc=0
	wait "$SERVER_PID" 2>/dev/null || rc=$?
	# 143 is SIGTERM's own status: a daemon that exits by the default action.
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ]; then
		cat "$SERVER_LOG" >&2
		die "$SERVER exited $rc on SIGTERM"
	fi
}

# metrics_check: gzramd's metrics, scraped by the guest at the hog's peak
# and after the swap is off, must show the traffic.
metrics_check() { # [ublk]
	{ grep -a '^E2E-METRIC ' "$CONSOLE" || true; } | tr -d '\r' | sed 's/^E2E-METRIC //' >"$CONSOLE.metrics"
	# Until the daemon serves /metrics the check cannot be made; say so
	# loudly rather than pass or fail on it (E2E_REQUIRE_METRICS=1: fail).
	local served=1
	if [ -n "$MPORT" ]; then
		python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
			"http://127.0.0.1:$MPORT/metrics" 2>/dev/null || served=0
	else
		[ -s "$CONSOLE.metrics" ] || served=0
	fi
	if [ "$served" = 0 ]; then
		[ "${E2E_REQUIRE_METRICS:-0}" = 1 ] && die "gzramd serves no /metrics"
		log "metrics: NOT CHECKED: gzramd serves no /metrics yet"
		return 0
	fi
	python3 "$E2E_DIR/metrics.py" "$CONSOLE.metrics" "$@"
}

# gpu_share NAME: which share of the pages gzramd compressed the GPU
# compressed (gzramd_compressed_pages_total by backend), read from the
# host daemon's /metrics while it still runs. Logs it and adds it to
# SHARES for the summary; says n/a where the metric is missing.
SHARES=()
gpu_share() {
	local share
	share=$(python3 - "http://127.0.0.1:$MPORT/metrics" <<'PY' 2>/dev/null
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
pages = {}
for m in re.finditer(r'^gzramd_compressed_pages_total\{backend="(\w+)"\} (\S+)$', text, re.M):
    pages[m.group(1)] = float(m.group(2))
total = sum(pages.values())
if not pages:
    print("n/a (no gzramd_compressed_pages_total)")
elif total == 0:
    print("n/a (no page compressed)")
else:
    gpu = pages.get("gpu", 0)
    print(f"{100 * gpu / total:.1f}% ({gpu:.0f} of {total:.0f} pages on the GPU)")
PY
	) || share="n/a (/metrics unreadable)"
	log "$1: GPU share of the compressed pages: $share"
	SHARES+=("$1 ${share%% (*}")
}

# tls_plain_refused: a plain client (nbd-client -l without TLS) must be
# refused by the TLS-only server.
tls_plain_refused() {
	local out
	out=$(timeout 20 nbd-client -l 127.0.0.1 "$PORT" 2>&1) &&
		die "$1: a plain client was served on the TLS port: $out"
	[[ "$out" == *"requires TLS"* ]] || die "$1: a plain client was refused, but not for want of TLS: $out"
	log "$1: a plain client is refused: $(echo "$out" | tail -n 1)"
}

# tls_check NAME CONNS: the guest's connections used TLS with its
# certificate: gzramd logged the handshakes, `gzramd status` (taken by
# guest_watch while the hog ran) listed them by the certificate's name,
# and the metrics at the hog's peak counted them under that name.
tls_check() {
	local name=$1 conns=$2 n
	n=$(grep -c "msg=\"nbd: TLS client connected\".* client=$TLS_CLIENT tls=\"TLS 1\.[23]\"" "$SERVER_LOG" || true)
	[ "$n" -ge "$conns" ] || die "$name: gzramd logged $n TLS handshakes from $TLS_CLIENT, want $conns"
	grep "msg=\"nbd: TLS client connected\"" "$SERVER_LOG" | sed 's/^/  /' >&2
	[ -s "$CONSOLE.status" ] || die "$name: no gzramd status taken while the hog ran"
	sed -n '/^NBD connections:/,$p' "$CONSOLE.status" | sed 's/^/  /' >&2
	n=$(grep -cE "^ +tcp +[^ ]+ +TLS $TLS_CLIENT +no " "$CONSOLE.status" || true)
	[ "$n" = "$conns" ] || die "$name: gzramd status listed $n TLS connections of $TLS_CLIENT while the hog ran, want $conns"
	n=$(awk -v s="gzramd_nbd_connections{client=\"$TLS_CLIENT\"}" '$1 == "peak" && $2 == s { print $3 }' "$CONSOLE.metrics")
	grep -E '^peak gzramd_nbd_connections\{' "$CONSOLE.metrics" | sed 's/^/  /' >&2
	[ "${n:-0}" = "$conns" ] || die "$name: gzramd_nbd_connections{client=\"$TLS_CLIENT\"} at the hog's peak is ${n:-missing}, want $conns"
	grep -aE '^E2E-TLS ' "$CONSOLE" | tr -d '\r' >&2 || true
	log "$name: the guest's $conns connection(s) used TLS as $TLS_CLIENT"
}

passed=()
run_host() { # name smp conns [tls]
	local name=$1 smp=$2 conns=$3 seed=$RANDOM tlsdir= tlsarg=
	CONSOLE=$WORK/$name.console
	GUEST_INITRD=$INITRD
	if [ "${4:-}" = tls ]; then
		# The guest's certificate, its key and the CA go into its
		# initramfs at /etc/e2e-tls; the server's stay on the host.
		tlsdir=$WORK/$name.tls
		tls_certs "$tlsdir"
		install -D -m 0644 -t "$WORK/$name.root/etc/e2e-tls" "$tlsdir"/{ca-cert,client-cert,client-key}.pem
		GUEST_INITRD=$WORK/$name.cpio.gz
		initramfs_with_tree "$WORK/$name.root" "$GUEST_INITRD"
		# E2E_TLS_GUARD=1 (the default: flusher,cgroup,ramfs): the proxy
		# nbd-client forks runs as gzramd runs itself to serve swap, an
		# IO flusher and real-time (ioflusher.c), in a cgroup that keeps
		# its pages out of swap, on a ramfs root whose files (its program,
		# GnuTLS) are never swapped out. 0: none, nbd-client as a user
		# runs it. Without any one of the three the guest deadlocked
		# (README.md).
		local guard=${E2E_TLS_GUARD:-1}
		[ "$guard" != 1 ] || guard=flusher,cgroup,ramfs
		[ "$guard" != 0 ] || guard=
		tlsarg=" e2e.tls=/etc/e2e-tls${guard:+ e2e.tlsguard=$guard}"
		[[ ",$guard," != *,ramfs,* ]] || tlsarg="$tlsarg rootfstype=ramfs"
	fi
	server_start "$name" "$tlsdir"
	[ -z "$tlsdir" ] || tls_plain_refused "$name"
	qemu_cmd "$GUEST_MEM" "$smp" "e2e.mode=client e2e.port=$PORT e2e.export=$EXPORT e2e.conns=$conns e2e.hog=$HOG_MIB e2e.seed=$seed${MPORT:+ e2e.metrics=10.0.2.2:$MPORT}$tlsarg"
	log "$name: booting ($ACCEL, $smp vCPU, $conns connection(s), server $SERVER on :$PORT${tlsdir:+ over TLS})"
	if [ -n "$tlsdir" ]; then
		# Who is connected, once the hog runs (the connection then
		# carries swap): gzramd status, kept for tls_check.
		guest_watch() {
			[ ! -s "$CONSOLE.status" ] && grep -aq '^E2E-STEP: hog ' "$CONSOLE" 2>/dev/null || return 0
			"$GZRAMD" status --metrics "127.0.0.1:$MPORT" >"$CONSOLE.status.tmp" 2>&1 &&
				mv "$CONSOLE.status.tmp" "$CONSOLE.status"
		}
	fi
	local ok=0
	guest_run "$TIMEOUT" || ok=$?
	unset -f guest_watch
	if [ "$EXPECT_FAIL" = 1 ]; then
		server_stop
		if [ "$ok" -eq 0 ]; then
			die "$name: E2E_EXPECT_FAIL=1 but the guest passed: the test did not catch the corruption"
		fi
		# The first 5, by one reader: `grep | head -5` under pipefail
		# (and set -e) ended the runner silently when grep matched
		# nothing, or died of SIGPIPE on a hog that printed many wrong
		# words.
		awk '/hog: pass|HOG-FAIL/ && n < 5 { sub(/\r$/, ""); print; n++ }' "$CONSOLE" >&2
		grep -aq 'HOG-FAIL' "$CONSOLE" ||
			die "$name: expected the hog to find wrong words, got: $GUEST_VERDICT"
		log "$name: failed as expected, the hog caught the corruption ($GUEST_WALL s)"
		passed+=("$name(expected-fail):${GUEST_WALL}s")
		return
	fi
	[ "$ok" -eq 0 ] || {
		echo "---- $SERVER log (tail) ----" >&2
		tail -n 20 "$SERVER_LOG" >&2
		die "$name: $GUEST_VERDICT"
	}
	grep -E '^(hog: |HOG-PASS|E2E-SWAP)' "$CONSOLE" | tr -d '\r' >&2
	if [ "$SERVER" = gzramd ]; then
		metrics_check || die "$name: metrics do not show the traffic"
		[ -z "$tlsdir" ] || tls_check "$name" "$conns"
		[ -z "$MPORT" ] || gpu_share "$name"
	fi
	server_stop
	log "$name: PASS ($GUEST_WALL s)"
	passed+=("$name:${GUEST_WALL}s")
}

run_guest() {
	if [[ "$("$GZRAMD" serve --help 2>&1 || true)" != *--swap* ]]; then
		[ "${E2E_REQUIRE_GUEST:-0}" = 1 ] && die "guest: $GZRAMD serve has no --swap flag"
		log "guest: SKIP: $GZRAMD serve has no --swap flag yet"
		return
	fi
	[ "$EXPECT_FAIL" = 1 ] && { log "guest: skipped under E2E_EXPECT_FAIL"; return; }
	CONSOLE=$WORK/guest.console
	GUEST_INITRD=$WORK/guest.cpio.gz
	initramfs_with_gzramd "$GZRAMD" "$GUEST_INITRD"
	# The daemon lives inside the guest here, so the guest gets more RAM.
	qemu_cmd "${E2E_GUEST_DAEMON_MEM:-320M}" 2 "e2e.mode=daemon e2e.size=$SIZE e2e.kconns=${E2E_GUEST_KCONNS:-2} e2e.minfree=${E2E_GUEST_MIN_FREE_KB:-16384} e2e.hog=${E2E_GUEST_HOG_MIB:-416} e2e.seed=$RANDOM e2e.daemon_args=${E2E_GUEST_DAEMON_ARGS:---backend,cpu}"
	log "guest: booting ($ACCEL, gzramd serve --swap inside the guest)"
	# It swaps about twice as much as the host scenarios, through a daemon
	# sharing the guest's two vCPUs: 160 s here under TCG, 240 s with the
	# host busy.
	guest_run "${E2E_GUEST_TIMEOUT:-$((2 * TIMEOUT))}" || die "guest: $GUEST_VERDICT"
	grep -E '^(hog: |HOG-PASS|E2E-SWAP)' "$CONSOLE" | tr -d '\r' >&2
	MPORT= metrics_check || die "guest: metrics do not show the traffic"
	log "guest: PASS ($GUEST_WALL s)"
	passed+=("guest:${GUEST_WALL}s")
}

# run_guest_ublk: gzramd inside the guest as in run_guest, serving its
# swap through ublk (init.sh's daemon mode with e2e.transport=ublk), on a
# ramfs root as the ublk scenario: gzramd's own files never go to swap.
run_guest_ublk() { # [staged]
	local name=guest-ublk gz=$GZRAMD env=
	[ "$EXPECT_FAIL" = 1 ] && { log "$name: skipped under E2E_EXPECT_FAIL"; return; }
	if [ "${1:-}" = staged ]; then
		# guest-ublk-staged: writes staged as with a GPU, by routetest's
		# stand-in (a -tags faults build, GZRAMD_FAULT_STAND_IN_GPU=1), and
		# received by the ublk queues straight into the staging slots.
		name=guest-ublk-staged env=" e2e.daemon_env=GZRAMD_FAULT_STAND_IN_GPU=1"
		gz=${E2E_FAULTS_GZRAMD:-$WORK/gzramd-faults}
		[ -n "${E2E_FAULTS_GZRAMD:-}" ] || (cd "$E2E_ROOT" && go build -tags faults -o "$gz" ./cmd/gzramd) ||
			die "$name: building a -tags faults gzramd (or name one: E2E_FAULTS_GZRAMD)"
	fi
	CONSOLE=$WORK/$name.console
	GUEST_INITRD=$WORK/$name.cpio.gz
	initramfs_with_gzramd "$gz" "$GUEST_INITRD"
	qemu_cmd "${E2E_GUEST_DAEMON_MEM:-320M}" 2 "e2e.mode=daemon e2e.transport=ublk e2e.size=$SIZE e2e.minfree=${E2E_GUEST_MIN_FREE_KB:-16384} e2e.hog=${E2E_GUEST_UBLK_HOG_MIB:-${E2E_GUEST_HOG_MIB:-416}} e2e.seed=$RANDOM e2e.daemon_args=${E2E_GUEST_DAEMON_ARGS:---backend,cpu}${env} rootfstype=ramfs"
	log "$name: booting ($ACCEL, kernel $KVER, gzramd serve --swap --transport ublk inside the guest${env:+;${env# e2e.daemon_env=}})"
	guest_run "${E2E_GUEST_TIMEOUT:-$((2 * TIMEOUT))}" || die "$name: $GUEST_VERDICT"
	grep -aE '^(hog: |HOG-PASS|E2E-SWAP|E2E-TRANSPORT)' "$CONSOLE" | tr -d '\r' >&2
	grep -aq '^E2E-TRANSPORT device=/dev/ublkb' "$CONSOLE" || die "$name: swap was not on a ublk device"
	MPORT= metrics_check ublk || die "$name: metrics do not show the traffic"
	if [ -n "$env" ]; then
		local staged
		staged=$(grep -aoE '^E2E-METRIC peak gzramd_staged_pages_total [0-9.e+]+' "$CONSOLE" | awk '{ print $4 }' | tail -1)
		log "$name: ${staged:-no} pages staged by the peak (gzramd_staged_pages_total)"
		awk -v n="${staged:-0}" 'BEGIN { exit !(n > 0) }' || die "$name: no write was staged: the stand-in GPU did not take them"
	fi
	log "$name: PASS ($GUEST_WALL s)"
	passed+=("$name:${GUEST_WALL}s")
}

# run_survive NAME: gzramd serves the guest's swap as in `guest` while the
# guest's killer SIGKILLs the serving process again and again (init.sh);
# the guest judges the hog, the kernel's log and the metrics, and
# survive.py the console. survive-control runs it with a device that
# fails its I/O as soon as its server dies (--kernel-dead-timeout=-1s):
# it passes only when the guest fails for that reason.
run_survive() {
	local name=$1 kills maxk kmin kmax every earlymax hog limit args=${E2E_GUEST_DAEMON_ARGS:---backend,cpu} upgrades=0 uevery=0 transport=
	local denv=${E2E_SURVIVE_DAEMON_ENV:-} base=$name
	# survive-ublk is survive-fast over ublk, and survive-control-ublk and
	# survive-mutant-ublk the control and the mutant: the kernel device
	# served over ublk (--transport ublk), taken over by ublk user
	# recovery, on the 6.12 kernel.
	case "$name" in
	survive-ublk) base=survive-fast transport=" e2e.transport=ublk" ;;
	*-ublk) base=${name%-ublk} transport=" e2e.transport=ublk" ;;
	esac
	case "$base" in
	survive)
		kills=${E2E_SURVIVE_KILLS:-20} kmin=${E2E_SURVIVE_MIN_S:-2} kmax=${E2E_SURVIVE_MAX_S:-6}
		every=${E2E_SURVIVE_EARLY_EVERY:-5} hog=${E2E_SURVIVE_HOG_MIB:-${E2E_GUEST_HOG_MIB:-416}}
		limit=${E2E_SURVIVE_TIMEOUT:-1500}
		upgrades=${E2E_SURVIVE_UPGRADES:-2} uevery=10
		;;
	survive-fast | survive-zstd | survive-objects | survive-dense | survive-mutant)
		kills=${E2E_SURVIVE_KILLS:-3} kmin=${E2E_SURVIVE_MIN_S:-3} kmax=${E2E_SURVIVE_MAX_S:-8}
		every=${E2E_SURVIVE_EARLY_EVERY:-2} hog=${E2E_SURVIVE_HOG_MIB:-${E2E_GUEST_HOG_MIB:-416}}
		limit=${E2E_SURVIVE_TIMEOUT:-900}
		upgrades=${E2E_SURVIVE_UPGRADES:-1} uevery=1000
		# survive-zstd: survive-fast with libzstd's codec (CPU backend),
		# the swapped-out clusters in zstd objects of up to 4 pages.
		[ "$base" != survive-zstd ] || args=$args,--algorithm,zstd,--object-pages,4
		# survive-objects: the swapped-out clusters kept in objects of
		# up to 8 pages, which takeovers must keep whole.
		[ "$base" != survive-objects ] || args=$args,--object-pages,8
		# survive-dense: groups of swapped-out pages idle for a second
		# recompressed into the dense tier while the kills come.
		[ "$base" != survive-dense ] || args=$args,--dense-after,1s,--dense-cpu,0.5
		# survive-mutant: survive-fast with a gzramd that loses a page at
		# each takeover from a dead process (a -tags faults build:
		# survive-mutant.sh); it passes only if the run fails for it.
		[ "$base" != survive-mutant ] ||
			denv=${denv:+$denv,}${E2E_SURVIVE_MUTANT_ENV:-GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER=1}
		;;
	survive-control)
		kills=${E2E_SURVIVE_KILLS:-1} kmin=${E2E_SURVIVE_MIN_S:-5} kmax=${E2E_SURVIVE_MAX_S:-10}
		every=0 hog=${E2E_SURVIVE_HOG_MIB:-${E2E_GUEST_HOG_MIB:-416}}
		limit=${E2E_SURVIVE_TIMEOUT:-900}
		args=$args,${E2E_SURVIVE_CONTROL_ARGS:---kernel-dead-timeout=-1s}
		;;
	esac
	# E2E_SURVIVE_ARGS: more gzramd flags for any survive scenario,
	# comma-separated (e.g. --algorithm,zstd).
	[ -z "${E2E_SURVIVE_ARGS:-}" ] || args=$args,$E2E_SURVIVE_ARGS
	maxk=${E2E_SURVIVE_MAX_KILLS:-$((kills < 5 ? 10 : 2 * kills))}
	# More upgrades than one every $uevery kills can give in the kills
	# planned (E2E_SURVIVE_UPGRADES=8 with 20 kills) come closer
	# together, so that the schedule asked for can be kept.
	if ((upgrades > 1 && kills / upgrades < uevery)); then
		uevery=$((kills / upgrades > 0 ? kills / upgrades : 1))
	fi
	# The initramfs is the guest's root: on tmpfs (the kernel's default) its
	# files, gzramd's binary and libraries among them, are swapped out to
	# /dev/nbd0 like anything else, and a serving process started while
	# no server runs cannot be executed (its execve faults on a swapped-out
	# page of the binary: seen, 2026-11-23). On ramfs they stay in memory,
	# as a disk's files stay readable.
	local root=" rootfstype=${E2E_SURVIVE_ROOTFS:-ramfs}"
	earlymax=${E2E_SURVIVE_EARLY_MAX_S:-0.2}
	CONSOLE=$WORK/$name.console
	GUEST_INITRD=$WORK/$name.cpio.gz
	initramfs_with_gzramd "$GZRAMD" "$GUEST_INITRD"
	qemu_cmd "${E2E_SURVIVE_MEM:-384M}" 2 "e2e.mode=survive e2e.size=$SIZE e2e.kconns=${E2E_GUEST_KCONNS:-2} e2e.minfree=${E2E_SURVIVE_MIN_FREE_KB:-65536} e2e.hog=$hog e2e.seed=$RANDOM e2e.daemon_args=$args e2e.kills=$kills e2e.maxkills=$maxk e2e.kmin=$kmin e2e.kmax=$kmax e2e.early=$every e2e.earlymax=$earlymax e2e.swapmax0=${E2E_SURVIVE_SWAPMAX0:-1} e2e.upgrades=$upgrades e2e.upgrade_every=$uevery${denv:+ e2e.daemon_env=$denv}${transport}${root}"
	log "$name: booting ($ACCEL, kernel $KVER, gzramd serve --swap inside the guest, killed $kills-$maxk times, $kmin-$kmax s apart, every ${every}th during a takeover; $upgrades+ planned upgrades; daemon args ${args//,/ }${denv:+; daemon environment ${denv//,/ }})"
	# A takeover that does not end is the failure to explain: once the
	# last kill is E2E_SURVIVE_STALL_S (120) old with no serving process
	# serving since, the kernel is asked for its blocked tasks, its memory
	# and every task's stack (sysrq w, m, t: the holder of a lock the
	# blocked wait on may be running) while the guest goes on to its
	# verdict.
	STALL_S=${E2E_SURVIVE_STALL_S:-120} STALL_KILL= STALL_SINCE=0
	guest_watch() {
		local kill
		kill=$(grep -ac '^E2E-KILL ' "$CONSOLE" 2>/dev/null || true)
		if [ "$kill" != "$STALL_KILL" ]; then
			STALL_KILL=$kill STALL_SINCE=$1
		elif [ "$kill" != 0 ] && (($1 - STALL_SINCE > STALL_S)) &&
			! served_since_last_kill "$CONSOLE"; then
			log "$name: no serving process serves $STALL_S s after kill $kill: asking the guest for sysrq w, m, t"
			echo "E2E-HOST: stalled: no serving process serves $STALL_S s after kill $kill" >>"$CONSOLE.host"
			sysrq "$CONSOLE.monitor" w m t
			# Time for every task's stack to reach the console.
			sleep "${E2E_SURVIVE_STALL_DUMP_S:-15}"
			STALL_SINCE=$((1 << 30))
			# The guest would hang on until the dead-connection timeout
			# (5 min) fails its swap I/O; E2E_SURVIVE_STALL_END=0 waits.
			# ($qpid is guest_run's QEMU.)
			[ "${E2E_SURVIVE_STALL_END:-1}" = 0 ] || kill "$qpid" 2>/dev/null || true
		fi
	}
	local ok=0
	guest_run "$limit" || ok=$?
	unset -f guest_watch
	if [ -s "$CONSOLE.host" ]; then
		cat "$CONSOLE.host" >&2
		[ "${E2E_SURVIVE_STALL_END:-1}" = 0 ] || GUEST_VERDICT="$(sed 's/^E2E-HOST: //' "$CONSOLE.host") (sysrq w, m, t in the console)"
	fi
	# || true: a guest that failed before any of these lines must reach
	# its verdict below, not end the runner silently (set -e, pipefail).
	grep -aE '^(hog: |HOG-|E2E-SWAP|E2E-KILL|E2E-UPGRADE|E2E-SURVIVE|E2E-DMESG|E2E-STACK)|msg="fault: ' "$CONSOLE" | tr -d '\r' >&2 || true
	if [ "$base" = survive-control ]; then
		# The device must have failed I/O when its server died: the guest
		# fails on the kernel's I/O errors or a hog that lost data (or the
		# kernel kills init, whose pages it could not read back).
		[ "$ok" -ne 0 ] || die "$name: passed: with survival off the test did not notice the lost server"
		case "$GUEST_VERDICT" in
		*"kernel I/O errors"* | *"hog failed"*) ;;
		*"Attempted to kill init"*)
			grep -aqE 'Read-error on swap-device|I/O error' "$CONSOLE" ||
				die "$name: init died without a swap read error: $GUEST_VERDICT"
			;;
		*) die "$name: failed, but not for losing the server: $GUEST_VERDICT" ;;
		esac
		grep -aq 'E2E-KILL 1 ' "$CONSOLE" || die "$name: failed before the first kill: $GUEST_VERDICT"
		log "$name: failed as expected ($GUEST_WALL s): $GUEST_VERDICT"
		passed+=("$name(expected-fail):${GUEST_WALL}s")
		return
	fi
	local sok=0
	python3 "$E2E_DIR/survive.py" "$CONSOLE" "$kills" "$every" "$upgrades" >&2 || sok=1
	if [ "$base" = survive-mutant ]; then
		# The fault must have fired, and the run must have failed for the
		# page it lost: the hog found wrong words (or, where the page was
		# init's own, the kernel killed init, or the guest saw lost pages,
		# or the page was another process's and it died of a trap on it:
		# "traps: init[398] general protection fault", a shell init
		# forked, seen 2026-11-26; a trap in user space, not a kernel
		# fault, which lib.sh reports as a kernel failure too).
		local fired
		fired=$(grep -ac 'fault: lost a page after the takeover' "$CONSOLE" || true)
		[ "$fired" -gt 0 ] || die "$name: the fault never fired (GZRAMD a -tags faults build? $denv set? any kill taken over?): $GUEST_VERDICT"
		[ "$ok" -ne 0 ] || [ "$sok" -ne 0 ] ||
			die "$name: PASSED with $fired page(s) lost at takeovers: the survive checks do not notice a lost page"
		case "$GUEST_VERDICT" in
		*"hog failed"* | *"gzramd_lost_pages="* | *"Attempted to kill init"*) ;;
		*"kernel failure: "*"] traps: "*"] general protection fault "*) ;;
		*) grep -aq '^HOG-FAIL' "$CONSOLE" ||
			die "$name: failed, but not for the lost page ($fired lost): $GUEST_VERDICT" ;;
		esac
		log "$name: failed as expected ($GUEST_WALL s, $fired page(s) lost at takeovers): $GUEST_VERDICT"
		passed+=("$name(expected-fail):${GUEST_WALL}s")
		return
	fi
	[ "$sok" -eq 0 ] || ok=1
	case ",$args," in
	*,--algorithm,*)
		local algo=${args#*--algorithm,}
		algo=${algo%%,*}
		grep -aqE "msg=\"gzramd ready\".* algorithm=$algo( |\$)" "$CONSOLE" ||
			{ echo "e2e: $name: no \"gzramd ready\" line with algorithm=$algo" >&2; ok=1; }
		;;
	esac
	case ",$args," in
	*,--object-pages,*)
		# The pages were kept in objects of several pages to the end.
		grep -aqE '^E2E-METRIC end gzramd_packed_pages [1-9]' "$CONSOLE" ||
			{ echo "e2e: $name: no page in an object of several pages at the end (E2E-METRIC end gzramd_packed_pages)" >&2; ok=1; }
		;;
	esac
	case ",$args," in
	*,--dense-after,1s,*)
		# Pages were in the dense tier at the end.
		grep -aqE '^E2E-METRIC end gzramd_tier_pages\{tier="dense"\} [1-9]' "$CONSOLE" ||
			{ echo "e2e: $name: no page in the dense tier at the end (E2E-METRIC end gzramd_tier_pages{tier=\"dense\"})" >&2; ok=1; }
		;;
	esac
	[ "$ok" -eq 0 ] || {
		[ "${E2E_KEEP:-0}" = 1 ] || cp "$CONSOLE" "$E2E_CACHE/$name.console.failed" 2>/dev/null || true
		die "$name: $GUEST_VERDICT (console kept in $E2E_CACHE/$name.console.failed)"
	}
	[ "${E2E_SURVIVE_KEEP_CONSOLE:-}" = "" ] || cp "$CONSOLE" "$E2E_SURVIVE_KEEP_CONSOLE"
	log "$name: PASS ($GUEST_WALL s)"
	passed+=("$name:${GUEST_WALL}s")
}

# run_ublk: pkg/ublk's tests in the guest (go test -c, static): a ublk
# device served from memory by the test process, written, read back
# (O_DIRECT and dd), flushed, discarded, zeroed, timed at QD1 against
# the kernel's NBD client, made the guest's swap under the hog
# (E2E_UBLK_HOG_MIB, default 256, in E2E_UBLK_MEM, 320M; 0: no swap) and
# removed (init.sh's ublk mode). E2E_UBLK_RUN
# picks tests (-test.run), E2E_UBLK_READS the reads timed.
run_ublk() {
	local bin=$WORK/ublk.root/bin/ublk.test
	mkdir -p "$(dirname "$bin")"
	(cd "$E2E_ROOT" && CGO_ENABLED=0 go test -c -o "$bin" ./pkg/ublk) || die "ublk: go test -c ./pkg/ublk"
	CONSOLE=$WORK/ublk.console
	GUEST_INITRD=$WORK/ublk.cpio.gz
	initramfs_with_tree "$WORK/ublk.root" "$GUEST_INITRD"
	# A ramfs root: the test binary's pages stay in memory, never swapped
	# out to the device it serves (as survive's gzramd).
	local hog=${E2E_UBLK_HOG_MIB:-256}
	[ "$hog" != 0 ] || hog=
	qemu_cmd "${E2E_UBLK_MEM:-320M}" "${E2E_UBLK_SMP:-2}" "e2e.mode=ublk e2e.ublk_reads=${E2E_UBLK_READS:-2000}${hog:+ e2e.ublk_hog=$hog}${E2E_UBLK_RUN:+ e2e.ublk_run=$E2E_UBLK_RUN} rootfstype=ramfs"
	log "ublk: booting ($ACCEL, kernel $KVER, pkg/ublk's tests in the guest)"
	guest_run "$TIMEOUT" || die "ublk: $GUEST_VERDICT"
	grep -aE '^E2E-UBLK (---|ok|PASS|FAIL)|E2E-UBLK .*(serving|QD1|did not check|hog |HOG-)' "$CONSOLE" | tr -d '\r' >&2 || true
	log "ublk: PASS ($GUEST_WALL s)"
	passed+=("ublk:${GUEST_WALL}s")
}

for s in $SCENARIOS; do
	case "$s" in
	ublk) run_ublk ;;
	host-1) run_host host-1 1 1 ;;
	host-2) run_host host-2 2 2 ;;
	host-tls)
		if [ "$SERVER" != gzramd ]; then
			log "host-tls: skipped: gzramd only (E2E_SERVER=$SERVER)"
			continue
		fi
		run_host host-tls 1 1 tls
		;;
	guest) [ "$SERVER" = gzramd ] && run_guest ;;
	guest-ublk) [ "$SERVER" = gzramd ] && run_guest_ublk ;;
	guest-ublk-staged) [ "$SERVER" = gzramd ] && run_guest_ublk staged ;;
	survive | survive-fast | survive-control | survive-zstd | survive-objects | survive-dense | survive-mutant | survive-ublk | survive-control-ublk | survive-mutant-ublk)
		if [ "$EXPECT_FAIL" = 1 ]; then
			log "$s: skipped under E2E_EXPECT_FAIL"
			continue
		fi
		run_survive "$s"
		;;
	systemd | systemd-ublk)
		if [ "$EXPECT_FAIL" = 1 ]; then
			log "$s: skipped under E2E_EXPECT_FAIL"
			continue
		fi
		t=$SECONDS
		transport=nbd
		[ "$s" = systemd ] || transport=ublk
		E2E_SYSTEMD_TRANSPORT=$transport "$E2E_DIR/systemd.sh" || die "$s: see its output above"
		passed+=("$s:$((SECONDS - t))s")
		;;
	*) die "unknown scenario $s" ;;
	esac
done
log "PASS: ${passed[*]:-nothing ran} (total $((SECONDS - T0)) s)"
[ ${#SHARES[@]} -eq 0 ] || log "GPU share of the compressed pages: $(IFS=,; echo "${SHARES[*]}" | sed 's/,/, /g')"
