#!/usr/bin/env bash
# Builds and tests gzramd as a machine with Go and a C compiler but no C
# library's development files would: the day gzramd needs a system -dev
# package to build, this fails.
#
# In a private mount namespace it hides the headers, link-time libraries
# and pkg-config files of lz4 and zstd (overlay mounts with whiteouts over
# their directories; the runtime libraries stay, gcc itself needs
# libzstd.so.1) and checks that they are gone. Then, with an empty build
# cache and an empty module cache, it installs the daemon the way
#   go install github.com/gzramd/gzramd/cmd/gzramd@VERSION
# does, from a module proxy in a temporary directory that serves the
# working tree's tracked files as VERSION (other modules come from the
# machine's module cache, else from GOPROXY), checks that the binary needs
# no library but libc, and runs make vet and the unit tests (go test
# -short ./..., or the arguments given) in a copy of the same files.
#
# Needs root (for the mount namespace); .ci/run runs it as `make
# test-nodeps`.
set -euo pipefail

hidden_headers=(lz4.h lz4hc.h lz4frame.h lz4frame_static.h zstd.h zstd_errors.h zdict.h)
hidden_libs=(liblz4.a liblz4.so libzstd.a libzstd.so liblz4.pc libzstd.pc)

# Outside the namespace: a work directory, removed once the namespace and
# its mounts are gone.
if [ -z "${NODEPS_WORK:-}" ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "test/nodeps.sh: needs root, for a private mount namespace (sudo make test-nodeps)" >&2
		exit 1
	fi
	work=$(mktemp -d "${TMPDIR:-/tmp}/gzramd-nodeps.XXXXXX")
	status=0
	NODEPS_WORK=$work unshare --mount --propagation private "$0" "$@" || status=$?
	rm -rf "$work"
	exit "$status"
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$NODEPS_WORK
mkdir -p "$work/mnt"
mount -t tmpfs tmpfs "$work/mnt" # overlayfs wants its upper directories on a plain file system
CC=${CC:-gcc}
multiarch=$($CC -print-multiarch 2>/dev/null || true)

# hide DIR NAME...: an overlay of DIR in which those NAMEs it holds are
# deleted (whiteouts: character devices 0,0 in the upper directory).
hide() {
	local dir=$1 n=0 name upper
	shift
	[ -d "$dir" ] || return 0
	upper=$(mktemp -d "$work/mnt/overlay.XXXXXX")
	mkdir "$upper/upper" "$upper/work"
	for name in "$@"; do
		if [ -e "$dir/$name" ] || [ -L "$dir/$name" ]; then
			mknod "$upper/upper/$name" c 0 0
			n=$((n + 1))
		fi
	done
	[ "$n" -gt 0 ] || return 0
	mount -t overlay overlay -o "lowerdir=$dir,upperdir=$upper/upper,workdir=$upper/work" "$dir"
	echo "nodeps: hid $(ls "$upper/upper" | tr '\n' ' ')in $dir"
}
for dir in /usr/include /usr/local/include ${multiarch:+/usr/include/$multiarch}; do
	hide "$dir" "${hidden_headers[@]}"
done
for dir in /usr/lib /usr/local/lib /usr/lib64 ${multiarch:+/usr/lib/$multiarch /usr/lib/$multiarch/pkgconfig} \
	/usr/lib/pkgconfig /usr/local/lib/pkgconfig /usr/share/pkgconfig; do
	hide "$dir" "${hidden_libs[@]}"
done

# The hiding must work, or this check would pass on a machine that has
# the files.
for header in lz4.h zstd.h zdict.h; do
	if printf '#include <%s>\n' "$header" | $CC -x c -E - -o /dev/null 2>/dev/null; then
		echo "nodeps: $header is still visible to $CC; cannot check" >&2
		exit 1
	fi
done
for lib in -llz4 -lzstd -l:liblz4.a -l:libzstd.a; do
	if printf 'int main(void) { return 0; }\n' | $CC -x c - -o /dev/null "$lib" 2>/dev/null; then
		echo "nodeps: $CC still links $lib; cannot check" >&2
		exit 1
	fi
done
echo "nodeps: lz4 and zstd headers and link-time libraries hidden"

# The module as a proxy serves it: the tracked files of the working tree
# (git stash create makes a commit object of them and changes nothing
# else; with no changes it says nothing, and HEAD is the tree).
version=v0.0.0-nodeps
rev=$(GIT_AUTHOR_NAME=nodeps GIT_AUTHOR_EMAIL=nodeps@localhost GIT_COMMITTER_NAME=nodeps \
	GIT_COMMITTER_EMAIL=nodeps@localhost git -C "$repo" stash create)
rev=${rev:-HEAD}
proxy=$work/proxy/github.com/gzramd/gzramd/@v
mkdir -p "$proxy" "$work/src"
git -C "$repo" archive --format=zip --prefix="github.com/gzramd/gzramd@$version/" -o "$proxy/$version.zip" "$rev"
git -C "$repo" show "$rev:go.mod" >"$proxy/$version.mod"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$proxy/$version.info"
echo "$version" >"$proxy/list"
git -C "$repo" archive "$rev" | tar -x -C "$work/src"

hostcache=$(go env GOMODCACHE)/cache/download
goproxy=file://$work/proxy
[ -d "$hostcache" ] && goproxy=$goproxy,file://$hostcache
goproxy=$goproxy,$(go env GOPROXY)
export GOCACHE=$work/gocache GOMODCACHE=$work/modcache GOPATH=$work/gopath GOBIN=$work/bin
export GOPROXY=$goproxy GONOSUMDB=github.com/gzramd/gzramd GOFLAGS=-modcacherw GOTOOLCHAIN=local
export CGO_ENABLED=1
if [ -z "${GZRAMD_CORPUS:-}" ] && [ -f "$repo/../shared/corpus/memory-pages.bin.zst" ]; then
	export GZRAMD_CORPUS=$repo/../shared/corpus/memory-pages.bin.zst
fi

echo "nodeps: go install github.com/gzramd/gzramd/cmd/gzramd@$version (empty build and module caches)"
(cd "$work" && go install "github.com/gzramd/gzramd/cmd/gzramd@$version")
needed=$(readelf -d "$work/bin/gzramd" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
for lib in $needed; do
	case $lib in
	libc.so.* | ld-linux*) ;;
	*)
		echo "nodeps: the installed binary needs $lib; gzramd must need nothing but libc (needs: $needed)" >&2
		exit 1
		;;
	esac
done
echo "nodeps: installed; it needs $needed"

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-short ./...)
echo "nodeps: go test -count=1 ${args[*]}"
cd "$work/src"
make vet
go test -count=1 "${args[@]}"
