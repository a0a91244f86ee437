#!/usr/bin/env bash
# Packs what the end-to-end host scenarios (run.sh's host-1, host-2) need
# beside the repository into .e2e/gpu-e2e/bundle.tar.xz, for a GPU machine
# that has python3 but no Go, no Debian packages, no QEMU, no busybox and no
# network: qemu-system-x86_64 with every shared library, the loader, its TCG
# module and the firmware it loads (it runs through the carried loader, so
# the target's glibc does not matter; TCG needs no KVM), the guest kernel,
# the base initramfs run.sh builds (busybox, nbd-client, hog, httpget, the
# nbd and virtio modules) and gzramd, built from the working tree without
# its symbol table and debug information (4 MiB of xz rather than 10).
# At the end it boots the guest once with the bundle alone, the system's QEMU
# hidden (gpu-e2e-check.sh --probe; as root).
#
# Here (Debian 12, root, Go; 2-4 minutes on 2 busy cores):
#   ./test/e2e/gpu-e2e-bundle.sh
# Carry .e2e/gpu-e2e (the bundle alone, 27 MiB with gzramd: it fits the
# 64 MiB upload with the repository; no other binary is needed) and, on the
# GPU machine, from the repository root (E2E_TIMEOUT=240: two hung guests
# still end inside a 10-minute command):
#   E2E_BUNDLE=.e2e/gpu-e2e/bundle.tar.xz E2E_GZRAMD_ARGS="--backend gpu" \
#     E2E_TIMEOUT=240 ./test/e2e/run.sh 2>&1 | tee "$OUT/e2e.log"
# (run.sh unpacks it to /tmp; E2E_BUNDLE may also name the unpacked
# e2e-bundle directory; E2E_KEEP=1 keeps the consoles). The summary ends
# with the GPU's share of the compressed pages per scenario. On the host,
# run.sh then calls only bash, coreutils, grep, sed, tar with xz, and
# python3's standard library. Proof that the bundle alone suffices, here:
#   ./test/e2e/gpu-e2e-check.sh            # host-1 host-2, --backend cpu
#
# Environment: E2E_BUNDLE_GZRAMD (a gzramd binary to carry instead of the
# build; empty: none, run.sh then needs GZRAMD), E2E_BUNDLE_OUT (default
# .e2e/gpu-e2e/bundle.tar.xz), E2E_NO_DEPS=1 (do not run deps.sh),
# E2E_BUNDLE_CHECK=0 (skip the probe boot), E2E_BUNDLE_TRANSPORTS=1 (also
# what bench/transports.sh needs: Debian's 6.12 kernel, unless
# E2E_KERNEL_META names one, and the guest's extra archive with a static
# fio, zram's modules, the traces and the carried gzramd, 2 MiB more of
# xz; then, on the GPU machine,
#   E2E_BUNDLE=.e2e/gpu-e2e/bundle.tar.xz TRANSPORTS_OUT=$OUT/transports \
#     bench/transports.sh 2>&1 | tee "$OUT/transports.log"
# with the knobs its header lists).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

OUT=${E2E_BUNDLE_OUT:-$E2E_CACHE/gpu-e2e/bundle.tar.xz}
GZ=${E2E_BUNDLE_GZRAMD-build}
# What qemu_cmd's command line (the pc machine, -kernel, the default VGA,
# a virtio-net-pci NIC) makes QEMU read, found with strace -e openat on a
# boot: SeaBIOS, the VGA BIOS, the kvmvapic and linuxboot_dma option ROMs
# and the NIC's iPXE ROM; the TCG accelerator is a module in Debian's
# build. Missing any one, QEMU exits at once with the file's name, and the
# probe at the end fails.
FIRMWARE=(bios-256k.bin vgabios-stdvga.bin kvmvapic.bin linuxboot_dma.bin efi-virtio.rom)
MODULES=(accel-tcg-x86_64.so)
MODULE_DIRS=(/usr/lib/x86_64-linux-gnu/qemu /usr/lib64/qemu /usr/lib/qemu)

# carry_libs FILE: every shared library FILE needs (and the loader) into
# $B/lib, under the names the loader looks for.
carry_libs() {
	local lib
	for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
		[ -e "$B/lib/$(basename "$lib")" ] || cp -L "$lib" "$B/lib/"
	done
}

# carry_qemu: the binary in real/, a wrapper in bin/ that runs it through
# the carried loader and libraries and points it at the carried modules
# (QEMU_MODULE_DIR) and firmware (-L): with the binary started by the
# loader, QEMU would look for them next to the loader, in lib/../share.
carry_qemu() {
	local q f d m found
	q=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 missing (test/e2e/deps.sh)"
	cp -L "$q" "$B/real/"
	carry_libs "$q"
	cat >"$B/bin/qemu-system-x86_64" <<'EOF'
#!/bin/sh
# qemu-system-x86_64 from the e2e bundle (test/e2e/gpu-e2e-bundle.sh).
d=$(cd "$(dirname "$0")/.." && pwd)
QEMU_MODULE_DIR=$d/lib/qemu exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" \
	"$d/real/qemu-system-x86_64" -L "$d/share/qemu" "$@"
EOF
	chmod +x "$B/bin/qemu-system-x86_64"
	# QEMU's own firmware search path, in its order (-L help lists it).
	mkdir -p "$B/share/qemu" "$B/lib/qemu"
	for f in "${FIRMWARE[@]}"; do
		found=
		for d in $(qemu-system-x86_64 -L help); do
			[ -f "$d/$f" ] && { found=$d/$f; break; }
		done
		[ -n "$found" ] || die "firmware $f not found in $(qemu-system-x86_64 -L help | tr '\n' ' ')"
		cp -L "$found" "$B/share/qemu/"
	done
	for m in "${MODULES[@]}"; do
		found=
		for d in "${MODULE_DIRS[@]}"; do
			[ -f "$d/$m" ] && { found=$d/$m; break; }
		done
		# A QEMU built without modules has TCG inside.
		[ -n "$found" ] || { log "no QEMU module $m in ${MODULE_DIRS[*]}: assuming it is built in"; continue; }
		cp -L "$found" "$B/lib/qemu/"
		carry_libs "$found"
	done
}

# carry_guest: the kernel and run.sh's base initramfs, uncompressed: xz
# packs the cpio archive 40% smaller than its gzip, and the kernel boots
# either.
carry_guest() {
	kernel_fetch
	initramfs_base
	install -D -m 0644 "$KROOT/boot/vmlinuz-$KVER" "$B/kernel/boot/vmlinuz-$KVER"
	mkdir -p "$B/initramfs"
	INITRD_FILE=initramfs/$(basename "$INITRD" .gz)
	gzip -dc "$INITRD" >"$B/$INITRD_FILE"
}

# carry_transports: bench/transports.sh's extra archive for the guest
# (uncompressed: xz packs it with the rest), with the carried gzramd.
carry_transports() {
	TRANSPORTS_FILE=
	[ "${E2E_BUNDLE_TRANSPORTS:-0}" = 1 ] || return 0
	[ -n "$GZRAMD_FILE" ] || die "E2E_BUNDLE_TRANSPORTS=1 needs a gzramd in the bundle"
	TRANSPORTS_FILE=initramfs/transports.cpio
	GZRAMD=$B/$GZRAMD_FILE E2E_NO_DEPS=1 "$E2E_ROOT/bench/transports.sh" --layer "$B/$TRANSPORTS_FILE" ||
		die "bench/transports.sh --layer failed"
}

# carry_gzramd: the daemon, run natively on the target (it needs only libc,
# and the GPU's driver libraries are the target's). Built by the Makefile's
# own rule, with -s -w added.
carry_gzramd() {
	GZRAMD_FILE=
	case "$GZ" in
	"")
		log "E2E_BUNDLE_GZRAMD is empty: no gzramd in the bundle (run.sh then needs GZRAMD)"
		return
		;;
	build)
		make -s -C "$E2E_ROOT" build BIN="$B/gzramd" LDFLAGS='-s -w -X main.version=$(VERSION)' ||
			die "building gzramd failed (or set E2E_BUNDLE_GZRAMD to a binary)"
		GZ=$B/gzramd/gzramd
		;;
	*)
		[ -x "$GZ" ] || die "E2E_BUNDLE_GZRAMD=$GZ is not an executable"
		install -D -m 0755 "$GZ" "$B/gzramd/gzramd"
		;;
	esac
	GZRAMD_FILE=gzramd/gzramd
}

[ "${E2E_NO_DEPS:-0}" = 1 ] || "$E2E_DIR/deps.sh"
# bench/transports.sh wants ublk_drv: Debian's 6.12.
[ "${E2E_BUNDLE_TRANSPORTS:-0}" != 1 ] || export E2E_KERNEL_META=${E2E_KERNEL_META:-linux-image-6.12-amd64}
mkdir -p "$E2E_CACHE"
STAGE=$(mktemp -d "$E2E_CACHE/tmp.XXXXXX")
E2E_TMPS+=("$STAGE")
B=$STAGE/e2e-bundle
mkdir -p "$B/bin" "$B/lib" "$B/real"
carry_qemu
carry_guest
carry_gzramd
carry_transports
cat >"$B/bundle.env" <<EOF
KVER=$KVER
INITRD_FILE=$INITRD_FILE
GZRAMD_FILE=$GZRAMD_FILE
TRANSPORTS_FILE=$TRANSPORTS_FILE
MADE='$(date -u +%Y-%m-%dT%H:%MZ)${GZRAMD_FILE:+, $("$GZ" version 2>/dev/null || echo "gzramd of unknown version")}'
EOF
(cd "$B" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum >SHA256SUMS)

if [ "${E2E_BUNDLE_CHECK:-1}" = 0 ]; then
	log "E2E_BUNDLE_CHECK=0: not booting the guest from the bundle before packing"
elif [ "$(id -u)" = 0 ]; then
	"$E2E_DIR/gpu-e2e-check.sh" --probe "$B" || die "the bundle does not boot the guest on its own"
else
	log "not root: skipping the boot with the system's QEMU hidden (gpu-e2e-check.sh --probe)"
fi

log "packing $OUT"
mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" -cf - e2e-bundle | xz -6 -T0 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "$OUT: $(du -h "$OUT" | cut -f1) ($(du -sh "$B" | cut -f1) unpacked)"
