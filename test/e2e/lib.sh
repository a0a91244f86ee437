# Shared by test/e2e/run.sh and bench/e2e.sh: fetching Debian's kernel,
# building the guest initramfs, booting QEMU, picking ports, cleanup.
# Source it; it sets no options of its own.

E2E_ROOT=${E2E_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
E2E_DIR=$E2E_ROOT/test/e2e
E2E_CACHE=${E2E_CACHE:-$E2E_ROOT/.e2e}

log() { echo "e2e: $*" >&2; }
die() { echo "e2e: FAIL: $*" >&2; exit 1; }

# Processes to kill and paths to remove on exit; each script that sources
# this installs e2e_cleanup as its EXIT trap.
E2E_PIDS=()
E2E_TMPS=()
e2e_cleanup() {
	local pid
	for pid in "${E2E_PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${E2E_PIDS[@]}"; do
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	[ ${#E2E_TMPS[@]} -eq 0 ] || rm -rf "${E2E_TMPS[@]}"
}

# e2e_workdir TEMPLATE WHAT: sets WORK to a new directory (mktemp -d
# TEMPLATE) for a run's WHAT: kept, and said so, with E2E_KEEP=1; removed
# at exit otherwise.
e2e_workdir() {
	WORK=$(mktemp -d "$1")
	if [ "${E2E_KEEP:-0}" = 1 ]; then
		log "keeping $2 in $WORK"
	else
		E2E_TMPS+=("$WORK")
	fi
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # host port seconds pid
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		kill -0 "$4" 2>/dev/null || return 1
		(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

wait_log() { # file pattern seconds pid
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		kill -0 "$4" 2>/dev/null || return 1
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# kernel_fetch sets KVER (e.g. 6.1.0-56-amd64) and KROOT (the unpacked
# package, with modules.dep built). Cached under .e2e/kernel/<pkg>_<ver>;
# without apt access the newest cached kernel is used.
kernel_fetch() {
	local meta=${E2E_KERNEL_META:-linux-image-amd64} pkg ver dir deb
	pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !found { print $2; found = 1 }')
	if [ -z "$pkg" ] && [ "$(id -u)" = 0 ] && ! ls -d "$E2E_CACHE"/kernel/*/ >/dev/null 2>&1; then
		# A fresh machine may have no package lists at all.
		apt-get update -qq >/dev/null 2>&1 || true
		pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !found { print $2; found = 1 }')
	fi
	if [ -n "$pkg" ]; then
		ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2 }')
		dir=$E2E_CACHE/kernel/${pkg}_$ver
	else
		dir=$(ls -d "$E2E_CACHE"/kernel/*/ 2>/dev/null | sort -V | tail -1)
		[ -n "$dir" ] || die "cannot resolve $meta with apt-cache and no kernel is cached in $E2E_CACHE/kernel"
		dir=${dir%/}
	fi
	if [ ! -e "$dir/.done" ]; then
		log "fetching $pkg $ver"
		rm -rf "$dir" && mkdir -p "$dir/deb"
		(cd "$dir/deb" && apt-get download "$pkg=$ver" >/dev/null 2>&1) ||
			(apt-get update -qq && cd "$dir/deb" && apt-get download "$pkg=$ver" >/dev/null) ||
			die "apt-get download $pkg=$ver failed"
		deb=$(ls "$dir"/deb/*.deb)
		dpkg-deb -x "$deb" "$dir/root" || die "dpkg-deb -x $deb"
		rm -rf "$dir/deb"
		KVER=$(ls "$dir/root/lib/modules")
		depmod -b "$dir/root" "$KVER" || die "depmod $KVER"
		touch "$dir/.done"
	fi
	KROOT=$dir/root
	KVER=$(ls "$KROOT/lib/modules")
	[ -f "$KROOT/boot/vmlinuz-$KVER" ] || die "no vmlinuz in $KROOT"
}

# copy_with_libs ROOT BINARY DEST: copies a dynamic binary and every
# shared library ldd names into ROOT, keeping the libraries' paths.
copy_with_libs() {
	local root=$1 bin=$2 dest=$3 lib
	install -D -m 0755 "$bin" "$root$dest"
	for lib in $(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*'); do
		[ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
	done
}

# modules_copy ROOT LIST NAME...: copies the named modules of the kernel
# in $KROOT, and the modules they depend on, into ROOT under the same
# paths, and appends each one's path to the file ROOT/LIST in load order.
modules_copy() {
	local root=$1 list=$2 m mod
	shift 2
	for m in $(for name in "$@"; do
		modprobe -C /dev/null -d "$KROOT" -S "$KVER" --show-depends "$name" |
			awk '$1 == "insmod" { print $2 }'
	done); do
		mod=${m#"$KROOT"}
		[ -e "$root$mod" ] && continue
		install -D -m 0644 "$m" "$root$mod"
		echo "$mod" >>"$root$list"
	done
}

# initramfs_base: the guest without gzramd (busybox, nbd-client, hog, httpget,
# modules, /init). Cached by the versions and sources that go into it.
# Sets INITRD.
initramfs_base() {
	local key root
	key=$( {
		echo "$KVER"
		dpkg-query -W busybox-static nbd-client libc6 2>/dev/null
		cat "$E2E_DIR/init.sh" "$E2E_DIR/hog.c" "$E2E_DIR/httpget.c" "$E2E_DIR/killer.c" "$E2E_DIR/ioflusher.c" "$E2E_DIR/lib.sh"
	} | sha256sum | cut -c1-16)
	INITRD=$E2E_CACHE/initramfs/base-$KVER-$key.cpio.gz
	[ -s "$INITRD" ] && return 0
	log "building initramfs $INITRD"
	rm -f "$E2E_CACHE"/initramfs/base-*.cpio.gz # older keys
	root=$(mktemp -d "$E2E_CACHE/tmp.XXXXXX")
	mkdir -p "$root"/{bin,sbin,etc,lib64,dev,proc,sys,tmp,run}
	install -m 0755 /bin/busybox "$root/bin/busybox"
	[[ "$(LC_ALL=C ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] ||
		die "/bin/busybox is not static (install busybox-static)"
	install -m 0755 "$E2E_DIR/init.sh" "$root/init"
	gcc -O2 -static -Wall -o "$root/bin/hog" "$E2E_DIR/hog.c" || die "gcc -static hog.c (needs libc6-dev)"
	gcc -O2 -static -Wall -o "$root/bin/httpget" "$E2E_DIR/httpget.c" || die "gcc -static httpget.c"
	gcc -O2 -static -Wall -o "$root/bin/killer" "$E2E_DIR/killer.c" || die "gcc -static killer.c"
	gcc -O2 -static -Wall -o "$root/bin/ioflusher" "$E2E_DIR/ioflusher.c" || die "gcc -static ioflusher.c"
	copy_with_libs "$root" "$(command -v nbd-client)" /sbin/nbd-client
	# The modules the guest needs, in load order, with their dependencies.
	: >"$root/etc/e2e-modules"
	modules_copy "$root" /etc/e2e-modules nbd virtio_pci virtio_net
	grep -q '/nbd.ko' "$root/etc/e2e-modules" ||
		grep -q '^CONFIG_BLK_DEV_NBD=y' "$KROOT/boot/config-$KVER" ||
		die "kernel $KVER has no nbd driver"
	# ublk_drv where the kernel has it as a module (Debian's 6.12, not its
	# 6.1), in a list of its own: only the ublk scenario loads it.
	: >"$root/etc/e2e-modules-ublk"
	if modprobe -C /dev/null -d "$KROOT" -S "$KVER" --show-depends ublk_drv >/dev/null 2>&1; then
		modules_copy "$root" /etc/e2e-modules-ublk ublk_drv
	fi
	mkdir -p "$(dirname "$INITRD")"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp" &&
		mv "$INITRD.tmp" "$INITRD"
	rm -rf "$root"
}

# initramfs_with_gzramd BINARY OUT: the base initramfs plus a second cpio
# archive with gzramd and its shared libraries (the kernel unpacks
# concatenated archives in order). util-linux's mkswap, swapon and swapoff
# go in /usr/local/sbin, first on the daemon's PATH: gzramd runs them
# with the long options users' systems have, which busybox lacks.
initramfs_with_gzramd() {
	local bin=$1 out=$2 root t
	root=$(mktemp -d "$E2E_CACHE/tmp.XXXXXX")
	copy_with_libs "$root" "$bin" /bin/gzramd
	for t in mkswap swapon swapoff; do
		copy_with_libs "$root" "$(PATH=/usr/sbin:/sbin:$PATH command -v "$t")" "/usr/local/sbin/$t"
	done
	{
		cat "$INITRD"
		(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1)
	} >"$out"
	rm -rf "$root"
}

# initramfs_with_tree DIR OUT: the base initramfs plus a second cpio archive
# of DIR's tree, at the same paths in the guest (host-tls: the guest's
# certificates, made per run).
initramfs_with_tree() {
	{
		cat "$INITRD"
		(cd "$1" && find . | cpio -o -H newc --quiet | gzip -1)
	} >"$2"
}

# bundle_open: with E2E_BUNDLE (a bundle made by test/e2e/gpu-e2e-bundle.sh:
# its .tar.xz, or the directory it unpacks to) QEMU, its firmware, the guest
# kernel and the base initramfs come from the bundle, for a machine with
# none of Debian's packages. A .tar.xz is unpacked into a temporary
# directory. Every file is checked against the bundle's SHA256SUMS first:
# a file missing on the way fails here, by name, not as a guest that never
# boots. Puts the bundle's bin/ first on PATH and sets E2E_BUNDLE to the
# directory; the bundle's gzramd, if it carries one, becomes GZRAMD's default.
bundle_open() {
	local b=$E2E_BUNDLE dir
	if [ -f "$b" ]; then
		dir=$(mktemp -d /tmp/gzramd-e2e-bundle.XXXXXX)
		E2E_TMPS+=("$dir")
		tar -C "$dir" -xJf "$b" || die "cannot unpack the bundle $b (tar -xJ)"
		b=$dir/e2e-bundle
	fi
	[ -f "$b/bundle.env" ] && [ -f "$b/SHA256SUMS" ] ||
		die "$b is not an e2e bundle (no bundle.env, SHA256SUMS): make one with test/e2e/gpu-e2e-bundle.sh"
	E2E_BUNDLE=$(cd "$b" && pwd)
	(cd "$E2E_BUNDLE" && sha256sum --quiet --strict -c SHA256SUMS >&2) ||
		die "the bundle $E2E_BUNDLE is incomplete or damaged (files above)"
	# KVER, INITRD_FILE, GZRAMD_FILE (empty without one), MADE.
	. "$E2E_BUNDLE/bundle.env"
	PATH=$E2E_BUNDLE/bin:$PATH
	local v
	# awk reads to the end: `| head -1` could kill QEMU with SIGPIPE and,
	# under pipefail, fail a QEMU that works.
	v=$(qemu-system-x86_64 --version 2>&1 | awk 'NR == 1') ||
		die "the bundle's QEMU does not start: $v"
	log "bundle $E2E_BUNDLE ($MADE): $v, kernel $KVER"
}

# bundle_kernel: kernel_fetch and initramfs_base's results, from the
# bundle. Sets KVER, KROOT and INITRD.
bundle_kernel() {
	KROOT=$E2E_BUNDLE/kernel
	INITRD=$E2E_BUNDLE/$INITRD_FILE
	[ -f "$KROOT/boot/vmlinuz-$KVER" ] || die "no vmlinuz-$KVER in the bundle"
}

# accel_pick sets ACCEL to kvm or tcg. /dev/kvm can exist while its
# hypervisor refuses a stock kernel, so KVM is used only when a probe
# guest boots under it. E2E_ACCEL=kvm|tcg skips the probe.
accel_pick() {
	if [ -n "${E2E_ACCEL:-}" ]; then
		ACCEL=$E2E_ACCEL
		return
	fi
	ACCEL=tcg
	[ -w /dev/kvm ] || { log "no writable /dev/kvm: TCG"; return; }
	local plog
	plog=$(mktemp)
	# In a subshell: QEMU may abort (PVM refuses MSRs) and bash would
	# report that on our stderr.
	(timeout -k 2 "${E2E_KVM_PROBE_S:-20}" qemu-system-x86_64 -accel kvm -cpu host -m 128M \
		-kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$INITRD" \
		-append "console=ttyS0 panic=-1 e2e.mode=probe" \
		-display none -monitor none -serial "file:$plog" -no-reboot -nic none \
		>"$plog.qemu" 2>&1 || true) 2>/dev/null
	if grep -q 'E2E-PROBE-OK' "$plog"; then
		ACCEL=kvm
		log "KVM boots a guest: using KVM"
	else
		log "KVM did not boot the probe guest ($(tail -c 200 "$plog.qemu" | tr '\n' ' ')): TCG"
	fi
	rm -f "$plog" "$plog.qemu"
}

# qemu_cmd MEM SMP APPEND [QEMU-ARG...]: the command line for one guest
# run, in QEMU; further arguments are added as they are (a disk). The
# serial console goes to $CONSOLE; -no-reboot with panic=-1 makes a
# kernel panic end QEMU at once. QEMU_REBOOT=1 leaves -no-reboot out, for
# a guest that reboots in place (the same kernel and initramfs boot
# again, and the console file goes on): a panic then reboots too, which
# guest_run catches on the console.
qemu_cmd() {
	local mem=$1 smp=$2 append=$3 accel_args no_reboot=(-no-reboot)
	shift 3
	if [ "$ACCEL" = kvm ]; then
		accel_args=(-accel kvm -cpu host)
	else
		accel_args=(-accel "tcg,thread=${E2E_TCG_THREAD:-single}" -cpu max)
	fi
	[ "${QEMU_REBOOT:-0}" = 1 ] && no_reboot=()
	QEMU=(qemu-system-x86_64 "${accel_args[@]}" -m "$mem" -smp "$smp"
		-kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$GUEST_INITRD"
		-append "console=ttyS0 panic=-1 oops=panic zswap.enabled=0 sysrq_always_enabled=1 $append"
		-display none -monitor "unix:$CONSOLE.monitor,server,nowait" -serial "file:$CONSOLE" "${no_reboot[@]}"
		-nic "user,model=virtio-net-pci" "$@")
}

# sysrq MONITOR KEY...: presses Alt-SysRq-KEY in the guest through QEMU's
# monitor socket and gives the kernel a moment to print.
sysrq() {
	local mon=$1 k
	shift
	for k in "$@"; do
		python3 - "$mon" "$k" <<'PY' 2>/dev/null || true
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(f"sendkey alt-sysrq-{sys.argv[2]}\n".encode())
time.sleep(1)
PY
	done
	sleep 3
}

# served_since_last_kill CONSOLE: true when a serving process logged "gzramd
# ready" or "serving again after the takeover" after the console's last
# E2E-KILL line (a survive guest's takeover ended), false when none did or
# the console is unreadable. One reader over the whole file, no pipeline:
# `tac | sed '/^E2E-KILL /q' | grep -q` under pipefail failed as soon as the
# console outgrew the pipe buffer (tac died of SIGPIPE when sed quit), and
# the stall watch took that for a stall (issue 26).
served_since_last_kill() {
	[ -r "$1" ] || return 1
	LC_ALL=C awk '
		/^E2E-KILL / { served = 0 }
		/msg="(serving again after the takeover|gzramd ready)"/ { served = 1 }
		END { exit !served }' "$1"
}

# guest_stacks CONSOLE: the stacks in CONSOLE's sysrq dumps of the tasks
# a hang is about: those blocked (state D), and the threads of gzramd, of
# the ublk and nbd test servers and the swap hog, their io_uring workers
# and the kernel's nbd and ublk workers.
guest_stacks() {
	tr -d '\r' <"$1" | sed -E 's/^\[ *[0-9.]+\] ?//' | awk '
		/^task:/ {
			name = $1; sub(/^task:/, "", name)
			keep = ($2 == "state:D") || name ~ /^(gzramd|ublk|nbd|hog|iou-)/ ||
				(name ~ /^kworker.*(ublk|nbd)/ && $2 != "state:I")
		}
		/^task:|^Call Trace:|^ *<\/?(TASK|IRQ)>|^ +(\? )?[A-Za-z_0-9.]+\+0x|^(Code|R[A-Z0-9][A-Z0-9]?): / { if (keep) print; next }
		{ keep = 0 }'
}

# guest_hang_summary CONSOLE: guest_stacks's tasks, a line for each
# distinct stack with the number of tasks in it (one that sysrq w and t
# both show counts once): "3x gzramd S: futex_wait_queue < futex_wait",
# innermost frame first, the scheduler's own frames and the "? " guesses
# left out. CI's short tail of a hung run still shows it.
guest_hang_summary() {
	guest_stacks "$1" | awk '
		function flush() {
			if (task == "" || pid in seen) return
			seen[pid] = 1
			key = task " " state ":" frames
			if (!(key in count)) order[n++] = key
			count[key]++
			task = ""
		}
		/^task:/ {
			flush()
			task = $1; sub(/^task:/, "", task)
			state = $2; sub(/^state:/, "", state)
			pid = $0; sub(/.* pid:/, "", pid); sub(/ .*/, "", pid)
			frames = ""; depth = 0
			next
		}
		/^ +[A-Za-z_0-9.]+\+0x/ {
			f = $1; sub(/\+0x.*/, "", f)
			if (f ~ /^(__schedule|schedule|schedule_timeout|schedule_hrtimeout_range_clock|__pfx_.*)$/ || depth >= 7) next
			frames = frames (depth++ ? " < " : " ") f
		}
		END {
			flush()
			for (i = 0; i < n; i++) printf "%dx %s\n", count[order[i]], order[i]
		}'
}

# guest_run TIMEOUT: boots $QEMU and watches $CONSOLE until a verdict, a
# panic, QEMU exiting, or TIMEOUT seconds. Returns 0 only on
# "E2E-RESULT: PASS"; prints the console's tail on anything else.
guest_run() {
	local limit=$1 qpid start verdict=
	start=$SECONDS
	"${QEMU[@]}" </dev/null >"$CONSOLE.qemu" 2>&1 &
	qpid=$!
	E2E_PIDS+=("$qpid")
	local exited=0
	while :; do
		# Read QEMU's state before the console: a guest that prints its
		# verdict and powers off between the two reads is not "no verdict".
		kill -0 "$qpid" 2>/dev/null || exited=1
		# -a: a console with a stray NUL or binary byte is still text
		# (without it grep prints "binary file matches", not the line).
		if grep -aq '^E2E-RESULT: ' "$CONSOLE" 2>/dev/null; then
			verdict=$(grep -am1 '^E2E-RESULT: ' "$CONSOLE" | tr -d '\r')
			break
		fi
		if grep -aqE 'Kernel panic|BUG: |Oops|general protection fault' "$CONSOLE" 2>/dev/null; then
			verdict="kernel failure: $(grep -am1 -E 'Kernel panic|BUG: |Oops|general protection fault' "$CONSOLE" | tr -d '\r')"
			break
		fi
		if [ "$exited" = 1 ]; then
			verdict="QEMU exited without a verdict: $(cat "$CONSOLE.qemu")"
			break
		fi
		# A scenario may watch the console as it grows (guest_watch: e.g.
		# to ask for a dump of the blocked tasks while a guest stalls).
		if declare -F guest_watch >/dev/null; then
			guest_watch $((SECONDS - start))
		fi
		if ((SECONDS - start > limit)); then
			verdict="timeout: no verdict after $limit s (guest hung?)"
			# Ask the guest's kernel for its blocked tasks and memory state
			# (sysrq w, l, m, t) before QEMU goes: where a freeze sits.
			sysrq "$CONSOLE.monitor" w l m t
			break
		fi
		sleep 0.5
	done
	# Let the guest power off on its own after a verdict, then make sure.
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		kill -0 "$qpid" 2>/dev/null || break
		sleep 0.5
	done
	kill "$qpid" 2>/dev/null || true
	wait "$qpid" 2>/dev/null || true
	GUEST_WALL=$((SECONDS - start))
	GUEST_VERDICT=$verdict
	if [ "$verdict" = "E2E-RESULT: PASS" ]; then
		return 0
	fi
	echo "---- guest steps ----" >&2
	grep -aE '^(E2E-STEP|E2E-CHECK|E2E-SWAP|hog: |HOG-)' "$CONSOLE" | tr -d '\r' >&2 || true
	# The daemon's warnings and errors and the kernel's nbd and I/O
	# messages, wherever they are in the console: the tail alone may have
	# scrolled past the first failure.
	echo "---- gzramd warnings and errors, kernel nbd and I/O messages (first 60) ----" >&2
	grep -aE 'level=(WARN|ERROR)|nbd|I/O error|Read-error|Write-error|blocked for more' "$CONSOLE" | tr -d '\r' | head -n 60 >&2 || true
	if [ "${verdict#timeout}" != "$verdict" ]; then
		echo "---- blocked tasks (sysrq w) and the stacks of gzramd's, ublk's and nbd's threads (sysrq t) ----" >&2
		guest_stacks "$CONSOLE" | head -n 400 >&2 || true
	fi
	echo "---- guest console (tail) ----" >&2
	tail -n 40 "$CONSOLE" | tr -d '\r' >&2
	if [ "${verdict#timeout}" != "$verdict" ]; then
		# CI shows only the end of its output, where the console's tail
		# is sysrq t's run queues: where the hang sits comes last, short.
		echo "---- where it hung (sysrq t, a line a stack) and the last guest steps ----" >&2
		guest_hang_summary "$CONSOLE" | head -n 12 >&2 || true
		grep -aE '^(E2E-STEP|E2E-CHECK|hog: )' "$CONSOLE" | tr -d '\r' | tail -n 3 >&2 || true
	fi
	echo "---- end of console; verdict: $verdict" >&2
	return 1
}
