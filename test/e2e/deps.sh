#!/usr/bin/env bash
# Installs the Debian packages the end-to-end test and benchmark need.
# Runs apt-get update at most once, and only when something is missing,
# so a second run on a prepared machine costs nothing. Without root it
# only reports what is missing. Arguments COMMAND=PACKAGE add what one
# scenario alone needs (test/e2e/systemd.sh: debootstrap).
set -euo pipefail

# command → package providing it
declare -A need=(
	[qemu-system-x86_64]=qemu-system-x86
	[cpio]=cpio
	[nbd-client]=nbd-client
	[nbdkit]=nbdkit
	[nbdcopy]=libnbd-bin
	[fio]=fio
	[zstd]=zstd
	[python3]=python3
	[gcc]=build-essential
	[modinfo]=kmod
	[dpkg-deb]=dpkg
	[apt-get]=apt
	[openssl]=openssl
)
for arg in "$@"; do
	need[${arg%%=*}]=${arg#*=}
done
# files → package (no command on PATH to probe)
declare -A need_files=(
	[/bin/busybox]=busybox-static
	[/usr/lib/x86_64-linux-gnu/libc.a]=libc6-dev
)

missing=()
for cmd in "${!need[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
for f in "${!need_files[@]}"; do
	[ -e "$f" ] || missing+=("${need_files[$f]}")
done
# busybox must be the static build: the initramfs has no libc for it.
if [ -e /bin/busybox ] && [[ "$(LC_ALL=C ldd /bin/busybox 2>&1 || true)" != *"not a dynamic"* ]]; then
	missing+=(busybox-static)
fi
# Optional: the benchmark plot (falls back to gnuplot, then to no plot).
if [ "${E2E_WITH_PLOT:-0}" = 1 ] && ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
	missing+=(python3-matplotlib)
fi

if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
	echo "e2e deps: missing Debian packages (run as root to install): ${missing[*]}" >&2
	exit 1
fi
echo "e2e deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
