#!/usr/bin/env bash
# kernelvm.sh runs pkg/nbd's kernel tests (TestKernelAttachLive: netlink
# attach with several connections, re-attach, EBUSY, the ioctl fallback,
# detach) as root in a QEMU guest booting Debian's kernel, because CI
# containers have no nbd module. It reuses test/e2e/lib.sh for the kernel,
# its modules and the base initramfs, and adds a static pkg/nbd test
# binary with its own /init. Prints the guest's test output; exits 0 only
# when the tests pass. Needs qemu-system-x86_64, busybox-static, apt.
#   kernelvm.sh swap    instead: TestKernelSwapLive, swap on the device
#                       under the e2e hog (NBDVM_HOG_MIB, default 700,
#                       in a 1 GiB guest with a 512 MiB locked backend;
#                       NBDVM_MIN_FREE_KB sets vm.min_free_kbytes, 16384)
#   E2E_ACCEL=kvm|tcg   skip the KVM probe;  E2E_TIMEOUT  seconds (300)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
E2E_ROOT=$(cd "$here/../../.." && pwd)
. "$E2E_ROOT/test/e2e/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

tests=${NBDVM_TESTS:-'TestKernelAttachLive|TestGenlResolve|TestAttachKernelErrors|TestKernelReconnectLive|TestKernelIoctlNotSurvivable'}
mem=512M
if [ "${1:-}" = swap ]; then
	tests=TestKernelSwapLive
	mem=1G
fi
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
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
while read -r mod; do
	insmod "$mod" || echo "insmod $mod failed"
done </etc/e2e-modules
cd /tmp
export NBD_SWAP_HOG=/bin/hog NBD_SWAP_HOG_MIB="$(cat /etc/nbdvm-hog-mib)"
sysctl -w vm.min_free_kbytes="$(cat /etc/nbdvm-min-free-kb)" >/dev/null
if /bin/nbd.test -test.v -test.count=1 -test.timeout=20m -test.run "$(cat /etc/nbdvm-tests)"; then
	echo "E2E-RESULT: PASS"
else
	echo "E2E-RESULT: FAIL"
fi
sync
poweroff -f
sleep 60
INIT
chmod 0755 "$work/root/init"
mkdir -p "$work/root/etc"
echo "$tests" >"$work/root/etc/nbdvm-tests"
echo "${NBDVM_HOG_MIB:-700}" >"$work/root/etc/nbdvm-hog-mib"
echo "${NBDVM_MIN_FREE_KB:-16384}" >"$work/root/etc/nbdvm-min-free-kb"
GUEST_INITRD=$work/initrd.cpio.gz
{
	cat "$INITRD"
	(cd "$work/root" && find . | cpio -o -H newc --quiet | gzip -1)
} >"$GUEST_INITRD"
CONSOLE=$work/console
qemu_cmd "$mem" 2 ""
log "booting $KVER ($ACCEL)"
status=0
guest_run "${E2E_TIMEOUT:-300}" || status=$?
tr -d '\r' <"$CONSOLE" | sed -n '/^=== RUN\|^---\|^    \|^PASS\|^FAIL\|^ok\|E2E-RESULT/p'
log "guest ran ${GUEST_WALL}s: $GUEST_VERDICT"
exit $status
