#!/usr/bin/env bash
# Proves, here, that a bundle from gpu-e2e-bundle.sh is all run.sh's host
# scenarios need from outside the repository, as on the GPU machine: in a
# private mount namespace it hides Debian's QEMU (binaries, firmware, modules
# and the libraries only QEMU uses), busybox, nbd-client, nbdkit, the
# compilers, cpio, gzip and the packaging tools run.sh would otherwise call
# (overlay mounts with whiteouts, as test/nodeps.sh does), checks that they
# are gone, and runs run.sh with E2E_BUNDLE and an empty E2E_CACHE (no
# cached kernel or initramfs either). gzramd runs with --backend cpu unless
# E2E_GZRAMD_ARGS says otherwise (there is no GPU here).
#
# Usage (root, for the mount namespace):
#   ./test/e2e/gpu-e2e-check.sh [BUNDLE]          host-1 host-2 (E2E_SCENARIOS)
#   ./test/e2e/gpu-e2e-check.sh --probe [BUNDLE]  boot the guest to its probe
#       line and stop (10-20 s under TCG; what gpu-e2e-bundle.sh runs last)
#   ./test/e2e/gpu-e2e-check.sh --transports [BUNDLE]  bench/transports.sh
#       from a bundle made with E2E_BUNDLE_TRANSPORTS=1 (its TRANSPORTS_*
#       knobs pass through; fio hidden too)
# BUNDLE: the .tar.xz or the unpacked e2e-bundle directory (default
# .e2e/gpu-e2e/bundle.tar.xz).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

probe=0 transports=0
if [ "${1:-}" = --probe ]; then
	probe=1
	shift
elif [ "${1:-}" = --transports ]; then
	transports=1
	shift
fi
BUNDLE=$(realpath "${1:-$E2E_CACHE/gpu-e2e/bundle.tar.xz}")
[ -e "$BUNDLE" ] || die "no bundle $BUNDLE (test/e2e/gpu-e2e-bundle.sh makes it)"

# Outside the namespace: a work directory, removed once the namespace and
# its mounts are gone.
if [ -z "${GPU_E2E_CHECK_WORK:-}" ]; then
	[ "$(id -u)" = 0 ] || die "gpu-e2e-check.sh needs root, for a private mount namespace"
	work=$(mktemp -d /tmp/gzramd-e2e-check.XXXXXX)
	status=0
	args=()
	[ "$probe" = 0 ] || args+=(--probe)
	[ "$transports" = 0 ] || args+=(--transports)
	GPU_E2E_CHECK_WORK=$work unshare --mount --propagation private "$0" "${args[@]}" "$BUNDLE" || status=$?
	rm -rf "$work"
	exit "$status"
fi
work=$GPU_E2E_CHECK_WORK
mkdir -p "$work/mnt"
mount -t tmpfs tmpfs "$work/mnt" # overlayfs wants its upper directories on a plain file system

# hide DIR GLOB...: an overlay of DIR in which the entries matching the
# GLOBs are deleted (whiteouts: character devices 0,0 in the upper
# directory), so that they are absent as on a machine without them.
hide() {
	local dir=$1 n=0 pat path upper
	shift
	[ -d "$dir" ] || return 0
	upper=$(mktemp -d "$work/mnt/overlay.XXXXXX")
	mkdir "$upper/upper" "$upper/work"
	for pat in "$@"; do
		for path in "$dir"/$pat; do
			[ -e "$path" ] || [ -L "$path" ] || continue
			mknod "$upper/upper/$(basename "$path")" c 0 0
			n=$((n + 1))
		done
	done
	[ "$n" -gt 0 ] || return 0
	mount -t overlay overlay -o "lowerdir=$dir,upperdir=$upper/upper,workdir=$upper/work" "$dir"
	log "check: hid $n in $dir"
}
hide /usr/bin 'qemu-*' busybox gcc 'gcc-*' cc 'x86_64-linux-gnu-gcc*' cpio gzip 'zstd*' 'apt*' 'dpkg*' \
	nbdkit nbdcopy nbdinfo fio
hide /usr/sbin nbd-client depmod modprobe
hide /usr/share qemu seabios
hide /usr/lib ipxe
hide /usr/lib/x86_64-linux-gnu qemu 'libslirp.so*' 'libcapstone.so*' 'libpixman-1.so*' 'libfdt*' \
	'libvdeplug*' 'liburing.so*' 'libpmem*' 'librdmacm.so*' 'libibverbs.so*' 'libnuma.so*' 'libaio.so*'

# The hiding must work, or this check would pass on a machine that has
# the files.
for t in qemu-system-x86_64 busybox nbd-client gcc cpio gzip apt-get dpkg-deb depmod fio zstd; do
	! command -v "$t" >/dev/null || die "check: $t is still on PATH; cannot check"
done
for f in /usr/share/seabios/bios-256k.bin /usr/share/qemu/kvmvapic.bin /usr/lib/ipxe/qemu/efi-virtio.rom \
	/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so /usr/lib/x86_64-linux-gnu/libslirp.so.0; do
	[ ! -e "$f" ] || die "check: $f is still there; cannot check"
done
log "check: Debian's QEMU, firmware, busybox, nbd-client, compilers and apt hidden"

export E2E_CACHE=$work/cache # no cached kernel, initramfs or bundle
if [ "$transports" = 1 ]; then
	E2E_BUNDLE=$BUNDLE exec "$E2E_ROOT/bench/transports.sh"
fi
if [ "$probe" = 0 ]; then
	E2E_BUNDLE=$BUNDLE E2E_GZRAMD_ARGS=${E2E_GZRAMD_ARGS:---backend cpu} exec "$E2E_DIR/run.sh"
fi

# --probe: the guest boots with qemu_cmd's command line (its NIC and
# firmware included) and prints its probe line.
trap e2e_cleanup EXIT
E2E_BUNDLE=$BUNDLE
bundle_open
bundle_kernel
ACCEL=tcg CONSOLE=$work/probe.console GUEST_INITRD=$INITRD
qemu_cmd 128M 1 "e2e.mode=probe"
start=$SECONDS
timeout -k 2 "${E2E_PROBE_TIMEOUT:-120}" "${QEMU[@]}" </dev/null >"$CONSOLE.qemu" 2>&1 || true
if ! grep -q 'E2E-PROBE-OK' "$CONSOLE" 2>/dev/null; then
	echo "---- QEMU ----" >&2
	cat "$CONSOLE.qemu" >&2
	echo "---- console (tail) ----" >&2
	tail -n 20 "$CONSOLE" 2>/dev/null | tr -d '\r' >&2 || true
	die "check: the bundle's QEMU did not boot the guest to its probe line"
fi
log "check: the bundle alone boots the guest (probe, $((SECONDS - start)) s)"
