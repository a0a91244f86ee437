#!/usr/bin/env bash
# kernelvm.sh runs pkg/nbd's kernel tests (TestKernelAttachLive: netlink
# attach with several connections, re-attach, EBUSY, the ioctl fallback,
# detach) as root in a QEMU guest booting Debian's kernel, because CI
# containers have no nbd module. It reuses test/e2e/lib.sh for the kernel,
# its modules and the base initramfs, and adds a static pkg/nbd test
# binary with its own /init. Prints the guest's test output; exits 0 only
# when the tests pass. Needs qemu-system-x86_64, busybox-static, apt.
#   E2E_ACCEL=kvm|tcg   skip the KVM probe;  E2E_TIMEOUT  seconds (300)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
E2E_ROOT=$(cd "$here/../../.." && pwd)
. "$E2E_ROOT/test/e2e/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

kernel_fetch
initramfs_base
accel_pick
work=$(mktemp -d /tmp/gzramd-nbdvm.XXXXXX)
E2E_TMPS+=("$work")
mkdir -p "$work/root/bin"
log "building the static pkg/nbd test binary"
(cd "$E2E_ROOT" && CGO_ENABLED=0 go test -c -o "$work/root/bin/nbd.test" ./pkg/nbd)
cat >"$work/root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp
while read -r mod; do
	insmod "$mod" || echo "insmod $mod failed"
done </etc/e2e-modules
cd /tmp
if /bin/nbd.test -test.v -test.count=1 -test.run 'TestKernelAttachLive|TestGenlResolve|TestAttachKernelErrors'; then
	echo "E2E-RESULT: PASS"
else
	echo "E2E-RESULT: FAIL"
fi
sync
poweroff -f
sleep 60
INIT
chmod 0755 "$work/root/init"
GUEST_INITRD=$work/initrd.cpio.gz
{
	cat "$INITRD"
	(cd "$work/root" && find . | cpio -o -H newc --quiet | gzip -1)
} >"$GUEST_INITRD"
CONSOLE=$work/console
qemu_cmd 512M 2 ""
log "booting $KVER ($ACCEL)"
status=0
guest_run "${E2E_TIMEOUT:-300}" || status=$?
tr -d '\r' <"$CONSOLE" | sed -n '/^=== RUN\|^---\|^    \|^PASS\|^FAIL\|^ok\|E2E-RESULT/p'
log "guest ran ${GUEST_WALL}s: $GUEST_VERDICT"
exit $status
