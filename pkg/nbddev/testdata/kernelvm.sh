#!/usr/bin/env bash
# kernelvm.sh runs pkg/nbddev's kernel tests (TestKernelAttachLive: netlink
# attach with several connections, re-attach, EBUSY, the ioctl fallback,
# detach; TestKernelReconnectLive: reconnecting a device whose server lost
# its sockets) as root in a QEMU guest booting Debian's kernel, because CI
# containers have no nbd module. It reuses test/e2e/lib.sh for the kernel,
# its modules and the base initramfs, and adds a static pkg/nbddev test
# binary with its own /init. Prints the guest's test output; exits 0 only
# when the tests pass. Needs qemu-system-x86_64, busybox-static, apt.
#   kernelvm.sh swap    instead: TestKernelSwapLive, swap on the device
#                       under the e2e hog (NBDVM_HOG_MIB, default 700,
#                       in a 1 GiB guest with a 512 MiB locked backend;
#                       NBDVM_MIN_FREE_KB sets vm.min_free_kbytes, 16384)
#   kernelvm.sh survive instead: TestKernelSurviveLive, the server killed
#                       with SIGKILL NBDVM_KILLS times (20) while I/O is
#                       in flight and replaced by a new process that takes
#                       the device over (block device, verified), then the
#                       negative controls, each of which must fail (no
#                       dead-connection timeout, no request timeout, no
#                       reconnect), then swap under the hog with a warm
#                       standby server (NBDVM_SWAP_KILLS, 10; hog
#                       NBDVM_HOG_MIB, default 600 here, in a 1 GiB guest).
#                       NBDVM_SURVIVE_TIMEOUT sets the request timeout in
#                       seconds (the package default otherwise);
#                       NBDVM_SURVIVE_RUNS=block,controls,swap picks runs.
#                       About 6 minutes under TCG.
#   E2E_KERNEL_META     the kernel package (default linux-image-amd64, 6.1;
#                       linux-image-6.12-amd64 from bookworm-security)
#   E2E_ACCEL=kvm|tcg   skip the KVM probe;  E2E_TIMEOUT  seconds (300;
#                       survive: 1500)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
E2E_ROOT=$(cd "$here/../../.." && pwd)
. "$E2E_ROOT/test/e2e/lib.sh"
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

# Each run is a line: the outcome it must have (pass or fail), the
# environment (comma-separated, "-" for none), and the tests' pattern.
runs="pass - TestKernelAttachLive|TestGenlResolve|TestAttachKernelErrors|TestKernelReconnectLive|TestKernelIoctlNotSurvivable"
mem=512M
timeout=${E2E_TIMEOUT:-300}
case "${1:-}" in
swap)
	runs="pass NBD_SWAP_HOG=/bin/hog TestKernelSwapLive"
	mem=1G
	;;
survive)
	mem=1G
	timeout=${E2E_TIMEOUT:-1500}
	t=${NBDVM_SURVIVE_TIMEOUT:+,NBD_SURVIVE_TIMEOUT=$NBDVM_SURVIVE_TIMEOUT}
	k=NBD_SURVIVE_KILLS=${NBDVM_KILLS:-20}
	runs=
	for r in $(echo "${NBDVM_SURVIVE_RUNS:-block,controls,swap}" | tr ',' ' '); do
		case "$r" in
		block) runs+="pass NBD_SURVIVE=block,$k$t TestKernelSurviveLive"$'\n' ;;
		controls)
			for c in no-dead-timeout no-timeout no-reconnect; do
				runs+="fail NBD_SURVIVE=block,NBD_SURVIVE_KILLS=2,NBD_SURVIVE_CONTROL=$c$t TestKernelSurviveLive"$'\n'
			done
			;;
		swap) runs+="pass NBD_SURVIVE=swap,NBD_SWAP_HOG=/bin/hog,NBD_SURVIVE_KILLS=${NBDVM_SWAP_KILLS:-10}$t TestKernelSurviveLive"$'\n' ;;
		*) die "NBDVM_SURVIVE_RUNS: unknown run $r (block, controls, swap)" ;;
		esac
	done
	;;
"") ;;
*) die "usage: kernelvm.sh [swap|survive]" ;;
esac
hog_mib=${NBDVM_HOG_MIB:-700}
[ "${1:-}" = survive ] && hog_mib=${NBDVM_HOG_MIB:-600}
kernel_fetch
initramfs_base
accel_pick
work=$(mktemp -d /tmp/gzramd-nbdvm.XXXXXX)
E2E_TMPS+=("$work")
mkdir -p "$work/root/bin"
log "building the static pkg/nbddev test binary"
(cd "$E2E_ROOT" && CGO_ENABLED=0 go test -c -o "$work/root/bin/nbd.test" ./pkg/nbddev)
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
export NBD_SWAP_HOG_MIB="$(cat /etc/nbdvm-hog-mib)"
sysctl -w vm.min_free_kbytes="$(cat /etc/nbdvm-min-free-kb)" >/dev/null
echo "NBDVM-KERNEL: $(uname -r)"
verdict=PASS
while read -r expect envs tests; do
	[ -n "$expect" ] || continue
	[ "$envs" = - ] && envs=
	echo "NBDVM-RUN: expect $expect: $envs $tests"
	start=$(cut -d' ' -f1 /proc/uptime)
	if env $(echo "$envs" | tr ',' ' ') /bin/nbd.test -test.v -test.count=1 -test.timeout=20m -test.run "$tests"; then
		got=pass
	else
		got=fail
	fi
	echo "NBDVM-RUN-RESULT: expected $expect, got $got ($start s .. $(cut -d' ' -f1 /proc/uptime) s of uptime)"
	[ "$got" = "$expect" ] || verdict=FAIL
done </etc/nbdvm-runs
echo "E2E-RESULT: $verdict"
sync
poweroff -f
sleep 60
INIT
chmod 0755 "$work/root/init"
mkdir -p "$work/root/etc"
printf '%s\n' "$runs" >"$work/root/etc/nbdvm-runs"
echo "$hog_mib" >"$work/root/etc/nbdvm-hog-mib"
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
guest_run "$timeout" || status=$?
tr -d '\r' <"$CONSOLE" | sed -n '/^=== RUN\|^---\|^    \|^PASS\|^FAIL\|^ok\|E2E-RESULT\|^NBDVM-\|^SURVIVE-\|^HOG-\|^hog: \|survive server/p'
if [ -n "${NBDVM_KEEP_CONSOLE:-}" ]; then
	cp "$CONSOLE" "$NBDVM_KEEP_CONSOLE"
fi
log "guest ran ${GUEST_WALL}s: $GUEST_VERDICT"
exit $status
