#!/bin/busybox sh
# /init of the systemd guest's initramfs (test/e2e/systemd.sh): loads the
# modules the root needs (virtio-blk, ext4; Debian's kernel has them as
# modules), mounts root= and hands PID 1 over to the root's own systemd.
# e2e.mode=probe answers lib.sh's KVM probe instead.
/bin/busybox mkdir -p /proc /sys /dev /newroot
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

# A failure here is a verdict too: the host would otherwise wait for its
# timeout on a guest that can never get to the checks.
fail() {
	echo "E2E-RESULT: FAIL initramfs: $*"
	sync
	poweroff -f
	sleep 60
}

root= mode=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	root=*) root=${arg#root=} ;;
	e2e.mode=*) mode=${arg#e2e.mode=} ;;
	esac
done
if [ "$mode" = probe ]; then
	echo "E2E-PROBE-OK"
	poweroff -f
fi
[ -n "$root" ] || fail "no root= on the kernel command line"

# In dependency order (lib.sh's modules_copy). A module that does not load
# (crc32c-intel on a CPU without SSE4.2) is not fatal: the mount decides.
while read -r mod; do
	insmod "$mod" 2>/dev/null || echo "e2e-initramfs: insmod $mod failed"
done </etc/e2e-modules

# virtio-blk finds its disk asynchronously.
i=0
until [ -b "$root" ]; do
	i=$((i + 1))
	[ "$i" -gt 100 ] && fail "no $root after 10 s"
	sleep 0.1
done
mount -t ext4 -o rw "$root" /newroot || fail "mount -t ext4 $root"
# /sbin/init is an absolute link into the root: test it from there.
[ -L /newroot/sbin/init ] || [ -x /newroot/sbin/init ] || fail "$root has no /sbin/init"

# systemd mounts /proc and /sys itself; /dev goes along so that it keeps
# the nodes devtmpfs made.
mount --move /dev /newroot/dev
umount /sys /proc
exec switch_root /newroot /sbin/init
