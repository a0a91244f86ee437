#!/usr/bin/env bash
# Packs fio, nbdkit (+ memory plugin), nbdcopy, zstd and openssl (the TLS
# benchmarks' throwaway certificates) from this Debian machine, with every
# shared library and the loader, plus the corpus, into
# .e2e/gpu/bundle.tar.xz, so bench/e2e.sh can run on a GPU machine that has
# none of them and no package registry. Each tool runs through the carried
# loader (wrappers in b/bin), so the target's glibc does not matter.
#
# On the GPU machine, from the repository root (carry .e2e/gpu/bundle.tar.xz
# and bin/gzramd):
#   mkdir -p /tmp/x && tar -C /tmp/x -xJf .e2e/gpu/bundle.tar.xz && B=/tmp/x/b
#   PATH=$B/bin:$PATH E2E_NO_DEPS=1 E2E_NBDKIT_MEMORY=$B/lib/nbdkit-memory-plugin.so \
#     E2E_CORPUS=$B/memory-pages.bin.zst E2E_BENCH_BACKEND=gpu ./bench/e2e.sh
# and the trace replay (bench/trace.sh; the trace comes with the repository):
#   PATH=$B/bin:$PATH E2E_NBDKIT_MEMORY=$B/lib/nbdkit-memory-plugin.so ./bench/trace.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=$ROOT/.e2e/gpu
B=$OUTDIR/b
rm -rf "$OUTDIR" && mkdir -p "$B/bin" "$B/lib" "$B/real"
# GPU_BUNDLE_TOOLS leaves some out where a run needs less room beside
# its binaries (the carried tree is at most 64 MiB).
for t in ${GPU_BUNDLE_TOOLS:-fio nbdkit nbdcopy zstd openssl}; do
	p=$(command -v "$t")
	cp -L "$p" "$B/real/"
	for l in $(ldd "$p" | grep -o '/[^ ]*'); do cp -Ln "$l" "$B/lib/" 2>/dev/null || true; done
	printf '#!/bin/sh\nd=$(cd "$(dirname "$0")/.." && pwd)\nexec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/real/%s" "$@"\n' "$t" >"$B/bin/$t"
	chmod +x "$B/bin/$t"
done
plugin=/usr/lib/x86_64-linux-gnu/nbdkit/plugins/nbdkit-memory-plugin.so
cp "$plugin" "$B/lib/"
for l in $(ldd "$plugin" | grep -o '/[^ ]*'); do cp -Ln "$l" "$B/lib/" 2>/dev/null || true; done
cp "$ROOT/../shared/corpus/memory-pages.bin.zst" "$B/"
tar -C "$OUTDIR" -cf - b | xz -6 -T0 >"$OUTDIR/bundle.tar.xz"
rm -rf "$B"
ls -la "$OUTDIR/bundle.tar.xz"
