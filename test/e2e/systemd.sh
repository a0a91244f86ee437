#!/usr/bin/env bash
# deploy/systemd/gzramd.service under a real systemd: boots a Debian 12
# guest whose init is systemd (Debian's kernel, QEMU), installs gzramd in
# it as README.md's "With systemd" does, and checks (systemd/check.sh,
# inside the guest) that:
#   install    make install's files are where the unit expects them
#   start      `systemctl enable --now gzramd` returns with swap already on
#              (READY=1 only after swapon)
#   hardening  every hardening step succeeds inside the unit's sandbox
#   hog        a memory hog larger than the guest swaps through it and
#              reads every word back, twice
#   watchdog   systemd gets WATCHDOG=1 pings for several WatchdogSec periods
#   stop       `systemctl stop` turns swap off, detaches, exits 0
#   restart    `systemctl start` makes swap again
#   hold       a holder's data, stopped only after gzramd, is in swap
#   reload     `systemctl reload` (an upgrade): the serving process hands its
#              live connections to a new one; no nbd line in the kernel log
#   crash      SIGKILL the serving process: the supervisor's next one takes
#              the data and the kernel device over, the same device stays swap
#   crash-supervisor  SIGKILL the supervisor: Restart= starts the unit again,
#              the state comes back from the file descriptor store and is
#              taken over; no I/O error in the kernel log
#   reboot     after a real `systemctl reboot` the enabled unit is swap again
#   shutdown   and that reboot stopped gzramd cleanly (boot 1's journal):
#              swapoff read the holder's pages back, and they verify
# The guest reboots in place (QEMU without -no-reboot): one QEMU run, two
# boots, one console.
#
# Slow (minutes under TCG), so not among make test-e2e's default scenarios:
#   make test-systemd          or     E2E_SCENARIOS=systemd ./test/e2e/run.sh
#   make test-systemd-ublk     or     E2E_SCENARIOS=systemd-ublk ./test/e2e/run.sh
#
# Environment:
#   E2E_SYSTEMD_TRANSPORT  nbd (the default) or ublk: the guest's env file
#                        gets its GZRAMD_TRANSPORT=ublk line uncommented, the
#                        guest boots Debian's 6.12 (E2E_KERNEL_META, unless
#                        named) with ublk_drv, and the checks look for
#                        /dev/ublkbN where they look for /dev/nbdN
#   E2E_SYSTEMD_MEM, E2E_SYSTEMD_HOG_MIB  guest RAM (512M) and hog (640 MiB)
#   E2E_SYSTEMD_HOLD_MIB, E2E_SYSTEMD_PUSH_MIB  the data held in swap across
#                        the reboot (128) and the hog that pushes it there (320)
#   E2E_SYSTEMD_TIMEOUT  seconds for both boots before the guest counts as
#                        hung (1800)
#   E2E_SYSTEMD_DROPIN   a file installed in the guest as a drop-in of
#                        gzramd.service: a broken unit (systemd/mutants/*.conf,
#                        all of them: make test-systemd-mutants)
#   E2E_SYSTEMD_EXPECT_FAIL=CHECK  the run passes only if check CHECK fails
#                        (with a broken unit or GZRAMD, to see the test fail);
#                        a drop-in's "# e2e-expect-fail: CHECK" line sets it
#   GZRAMD               a binary to install instead of the one make install
#                        builds
#   E2E_SYSTEMD_SUITE    the guest's Debian release (bookworm: systemd 252;
#                        bullseye: systemd 247, an older systemd users run)
#   E2E_DEBIAN_MIRROR    debootstrap's mirror (http://deb.debian.org/debian)
#   E2E_KEEP=1, E2E_ACCEL, E2E_TCG_THREAD  as for run.sh
# Cache: .e2e/systemd/root-<suite>-<key> (the debootstrap root, made once;
# the key hashes what goes into it) and .e2e/initramfs/systemd-*.cpio.gz.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

SUITE=${E2E_SYSTEMD_SUITE:-bookworm}
MIRROR=${E2E_DEBIAN_MIRROR:-http://deb.debian.org/debian}
GUEST_MEM=${E2E_SYSTEMD_MEM:-512M}
HOG_MIB=${E2E_SYSTEMD_HOG_MIB:-640}
HOLD_MIB=${E2E_SYSTEMD_HOLD_MIB:-128}
PUSH_MIB=${E2E_SYSTEMD_PUSH_MIB:-320}
TIMEOUT=${E2E_SYSTEMD_TIMEOUT:-1800}
EXPECT_FAIL=${E2E_SYSTEMD_EXPECT_FAIL:-}
DROPIN=${E2E_SYSTEMD_DROPIN:-}
GZRAMD=${GZRAMD:-}
TRANSPORT=${E2E_SYSTEMD_TRANSPORT:-nbd}
CHECKS=(install start hardening hog watchdog stop restart hold reload crash crash-supervisor reboot shutdown)
# Beyond minbase: systemd as init, udev (the nbd device units), kmod
# (modprobe@nbd.service), util-linux (mkswap, swapon, swapoff: gzramd runs
# them), procps (free), e2fsprogs.
ROOT_PACKAGES=(systemd systemd-sysv udev kmod util-linux procps e2fsprogs)

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, and files owned by root in the guest's image)"
if [ -n "$DROPIN" ]; then
	[ -f "$DROPIN" ] || die "E2E_SYSTEMD_DROPIN=$DROPIN is not a file"
	[ -n "$EXPECT_FAIL" ] || EXPECT_FAIL=$(sed -n 's/^# e2e-expect-fail: *//p' "$DROPIN")
fi
[ -z "$GZRAMD" ] || [ -x "$GZRAMD" ] || die "GZRAMD=$GZRAMD is not executable"
case "$TRANSPORT" in
nbd) ;;
ublk)
	# ublk_drv with USER_COPY: Debian 12's 6.12, not its default 6.1 (as
	# run.sh's ublk scenarios).
	if [ -z "${E2E_KERNEL_META:-}" ]; then
		export E2E_KERNEL_META=linux-image-6.12-amd64
		log "ublk: kernel $E2E_KERNEL_META"
	fi
	;;
*) die "E2E_SYSTEMD_TRANSPORT must be nbd or ublk, not $TRANSPORT" ;;
esac
"$E2E_DIR/deps.sh" debootstrap=debootstrap mkfs.ext4=e2fsprogs

# root_customise DIR: what the cached root gets once, after debootstrap.
# It writes files in place, so it runs on the cache only: image_build
# shares the cache's files by hard links and only adds new ones.
root_customise() {
	local r=$1 u
	echo gzramd-e2e >"$r/etc/hostname"
	# The initramfs mounts / read-write; nothing to fsck it with before.
	echo '/dev/vda / ext4 rw,errors=remount-ro 0 0' >"$r/etc/fstab"
	# No login prompts, and nothing on a timer competing with the test for
	# two emulated CPUs.
	for u in getty@tty1.service serial-getty@ttyS0.service apt-daily.timer apt-daily-upgrade.timer \
		dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
		ln -sfn /dev/null "$r/etc/systemd/system/$u"
	done
	# Boot 2 reads in boot 1's journal how the reboot stopped gzramd.
	mkdir -p "$r/var/log/journal"
	rm -f "$r"/var/cache/apt/archives/*.deb
	rm -rf "$r"/var/lib/apt/lists/*
}

# root_fetch: a Debian 12 root with systemd as init, made by debootstrap
# once and kept; sets SYSROOT.
root_fetch() {
	local key tmp
	key=$( {
		echo "$SUITE $MIRROR ${ROOT_PACKAGES[*]}"
		declare -f root_customise
	} | sha256sum | cut -c1-16)
	SYSROOT=$E2E_CACHE/systemd/root-$SUITE-$key
	[ -e "$SYSROOT.done" ] && return 0
	log "debootstrap $SUITE (minbase + ${ROOT_PACKAGES[*]}) into $SYSROOT"
	rm -rf "$E2E_CACHE/systemd/root-$SUITE-"* # older keys
	mkdir -p "$E2E_CACHE/systemd"
	tmp=$SYSROOT.tmp
	rm -rf "$tmp"
	debootstrap --variant=minbase --include="$(
		IFS=,
		echo "${ROOT_PACKAGES[*]}"
	)" "$SUITE" "$tmp" "$MIRROR" >"$E2E_CACHE/systemd/debootstrap.log" 2>&1 || {
		tail -n 20 "$E2E_CACHE/systemd/debootstrap.log" >&2
		die "debootstrap failed (log: $E2E_CACHE/systemd/debootstrap.log)"
	}
	root_customise "$tmp"
	mv "$tmp" "$SYSROOT"
	touch "$SYSROOT.done"
}

# initramfs_systemd: busybox, the modules that mount the root (virtio-blk,
# ext4) and systemd/init.sh, which switch_roots to the root's systemd.
# Cached by what goes into it; sets INITRD.
initramfs_systemd() {
	local key root
	key=$( {
		echo "$KVER"
		dpkg-query -W busybox-static 2>/dev/null
		cat "$E2E_DIR/systemd/init.sh"
		declare -f modules_copy
	} | sha256sum | cut -c1-16)
	INITRD=$E2E_CACHE/initramfs/systemd-$KVER-$key.cpio.gz
	[ -s "$INITRD" ] && return 0
	log "building initramfs $INITRD"
	rm -f "$E2E_CACHE"/initramfs/systemd-"$KVER"-*.cpio.gz # older keys (each kernel keeps its own)
	root=$(mktemp -d "$E2E_CACHE/tmp.XXXXXX")
	mkdir -p "$root"/{bin,etc,dev,proc,sys,newroot}
	install -m 0755 /bin/busybox "$root/bin/busybox"
	[[ "$(LC_ALL=C ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] ||
		die "/bin/busybox is not static (install busybox-static)"
	install -m 0755 "$E2E_DIR/systemd/init.sh" "$root/init"
	: >"$root/etc/e2e-modules"
	modules_copy "$root" /etc/e2e-modules virtio_pci virtio_blk ext4
	mkdir -p "$(dirname "$INITRD")"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp" &&
		mv "$INITRD.tmp" "$INITRD"
	rm -rf "$root"
}

# image_build: this run's disk, $WORK/disk.img. The cached root is shared
# by hard links (cp -al: everything added here is a new file, so nothing
# writes through to the cache); gzramd goes in by `make install
# DESTDIR=`, the README's first step (with E2E_SYSTEMD_TRANSPORT=ublk,
# the env file's GZRAMD_TRANSPORT=ublk taken in, as a user would); then
# the kernel's modules the root loads (nbd and, where the kernel has it,
# ublk_drv, for the unit's modprobe@nbd.service and
# modprobe@ublk_drv.service) and the checks. mkfs.ext4 -d turns the tree
# into the image: no loop mount.
image_build() {
	local root=$WORK/root m mods=(nbd)
	cp -al "$SYSROOT" "$root"
	make -C "$E2E_ROOT" --no-print-directory install DESTDIR="$root" >"$WORK/make-install.log" 2>&1 || {
		cat "$WORK/make-install.log" >&2
		die "make install DESTDIR=$root failed"
	}
	if [ -n "$GZRAMD" ]; then
		log "installing $GZRAMD as /usr/local/bin/gzramd instead of the build"
		install -m 0755 "$GZRAMD" "$root/usr/local/bin/gzramd"
	fi
	if [ "$TRANSPORT" = ublk ]; then
		# The env file's commented line, as its comment tells a user.
		sed -i 's/^#GZRAMD_TRANSPORT=ublk$/GZRAMD_TRANSPORT=ublk/' "$root/etc/gzramd/gzramd.env"
		grep -qx GZRAMD_TRANSPORT=ublk "$root/etc/gzramd/gzramd.env" ||
			die "deploy/systemd/gzramd.env has no '#GZRAMD_TRANSPORT=ublk' line to uncomment"
	fi
	if modprobe -C /dev/null -d "$KROOT" -S "$KVER" --show-depends ublk_drv >/dev/null 2>&1; then
		mods+=(ublk_drv)
	else
		[ "$TRANSPORT" != ublk ] || die "kernel $KVER has no ublk_drv module (E2E_KERNEL_META=${E2E_KERNEL_META:-})"
	fi
	# The same modules as the initramfs too, so that the root's
	# modules.dep knows what is already loaded.
	modules_copy "$root" /tmp/e2e-modules "${mods[@]}" virtio_pci virtio_blk ext4
	rm -f "$root/tmp/e2e-modules"
	for m in modules.order modules.builtin modules.builtin.modinfo; do
		install -m 0644 "$KROOT/lib/modules/$KVER/$m" "$root/lib/modules/$KVER/$m"
	done
	depmod -b "$root" "$KVER" || die "depmod -b $root $KVER"
	install -D -m 0755 "$E2E_DIR/systemd/check.sh" "$root/usr/local/lib/gzramd-e2e/check"
	gcc -O2 -static -Wall -o "$WORK/hog" "$E2E_DIR/hog.c" || die "gcc -static hog.c (needs libc6-dev)"
	install -m 0755 "$WORK/hog" "$root/usr/local/lib/gzramd-e2e/hog"
	install -m 0644 "$E2E_DIR/systemd/gzramd-e2e.service" "$root/etc/systemd/system/gzramd-e2e.service"
	ln -s ../gzramd-e2e.service "$root/etc/systemd/system/multi-user.target.wants/gzramd-e2e.service"
	if [ -n "$DROPIN" ]; then
		log "gzramd.service gets the drop-in $DROPIN"
		install -D -m 0644 "$DROPIN" "$root/etc/systemd/system/gzramd.service.d/e2e-mutant.conf"
	fi
	IMG=$WORK/disk.img
	mkfs.ext4 -q -F -L gzramd-e2e -d "$root" "$IMG" "${E2E_SYSTEMD_DISK:-2G}" >"$WORK/mkfs.log" 2>&1 || {
		cat "$WORK/mkfs.log" >&2
		die "mkfs.ext4 -d $root"
	}
	rm -rf "$root"
}

mkdir -p "$E2E_CACHE"
# Beside the cached root: cp -al.
e2e_workdir "$E2E_CACHE/tmp.XXXXXX" "the console, image and logs"
T0=$SECONDS
kernel_fetch
root_fetch
initramfs_systemd
accel_pick
image_build
log "transport $TRANSPORT, kernel $KVER, accel $ACCEL, Debian $SUITE with systemd $(chroot "$SYSROOT" systemctl --version | awk 'NR == 1 { print $2 }'), guest $GUEST_MEM RAM, hog $HOG_MIB MiB (setup $((SECONDS - T0)) s)"

CONSOLE=$WORK/console
GUEST_INITRD=$INITRD
QEMU_REBOOT=1
qemu_cmd "$GUEST_MEM" 2 "root=/dev/vda e2e.hog=$HOG_MIB e2e.hold=$HOLD_MIB e2e.push=$PUSH_MIB e2e.seed=$RANDOM e2e.transport=$TRANSPORT" \
	-drive "file=$IMG,format=raw,if=virtio"
log "systemd ($TRANSPORT): booting (boot 1 installs and checks, then reboots; boot 2 checks)"
ok=0
guest_run "$TIMEOUT" || ok=$?
checks=$(grep -aE '^E2E-CHECK: ' "$CONSOLE" | tr -d '\r' || true)

if [ -n "$EXPECT_FAIL" ]; then
	[ "$ok" -ne 0 ] || die "systemd ($TRANSPORT): E2E_SYSTEMD_EXPECT_FAIL=$EXPECT_FAIL, but every check passed"
	grep -q "^E2E-CHECK: FAIL $EXPECT_FAIL:" <<<"$checks" ||
		die "systemd ($TRANSPORT): expected check '$EXPECT_FAIL' to fail, got: $GUEST_VERDICT"
	log "systemd ($TRANSPORT): failed as expected at '$EXPECT_FAIL' ($GUEST_WALL s)"
	exit 0
fi
[ "$ok" -eq 0 ] || die "systemd ($TRANSPORT): $GUEST_VERDICT"
# A PASS verdict needs every check to have passed, in this run: a check
# the guest skipped is a failure too.
echo "$checks" >&2
for c in "${CHECKS[@]}"; do
	grep -q "^E2E-CHECK: PASS $c:" <<<"$checks" || die "systemd ($TRANSPORT): check '$c' did not pass (or did not run)"
done
log "systemd ($TRANSPORT): PASS ($GUEST_WALL s in the guest, $((SECONDS - T0)) s in all)"
