#!/usr/bin/env bash
# bench/zram-ratio.sh: the effective ratio (orig_data_size / mem_used_total)
# kernel zram reaches on the corpus with each of its algorithms, the
# yardstick for gzramd's (gzramd bench prints its own the same way).
#
# Usage: bench/zram-ratio.sh [CORPUS] [ALGORITHM...]
#   CORPUS: memory-pages.bin.zst (default: $GZRAMD_CORPUS, else
#   ../shared/corpus/); ALGORITHM: what /dev/zram0 offers (default: every
#   one of lzo-rle, lz4, zstd it lists in comp_algorithm).
# Needs root, a free /dev/zram0 (reset afterwards) and zstd. Prints one
# markdown row per algorithm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=${1:-${GZRAMD_CORPUS:-$root/../shared/corpus/memory-pages.bin.zst}}
shift || true
[ -r "$corpus" ] || { echo "zram-ratio: no corpus at $corpus (set GZRAMD_CORPUS)" >&2; exit 1; }
z=/sys/block/zram0
[ -d "$z" ] || { echo "zram-ratio: no /dev/zram0 (modprobe zram)" >&2; exit 1; }
grep -q '^0$' "$z/disksize" 2>/dev/null || [ "$(cat "$z/disksize")" = 0 ] ||
	{ echo "zram-ratio: /dev/zram0 is in use (disksize $(cat "$z/disksize")); reset it first" >&2; exit 1; }
command -v zstd >/dev/null || { echo "zram-ratio: zstd missing" >&2; exit 1; }
tmp=$(mktemp /tmp/zram-ratio.XXXXXX)
trap 'echo 1 >"$z/reset" 2>/dev/null || true; rm -f "$tmp"' EXIT
zstd -dqf "$corpus" -o "$tmp"
bytes=$(stat -c %s "$tmp")
algs=("$@")
if [ ${#algs[@]} -eq 0 ]; then
	for a in lzo-rle lz4 zstd; do grep -qw "$a" "$z/comp_algorithm" && algs+=("$a"); done
fi
echo "| zram algorithm | orig_data_size | compr_data_size | mem_used_total | effective ratio |"
echo "|---|---|---|---|---|"
for a in "${algs[@]}"; do
	echo 1 >"$z/reset"
	echo "$a" >"$z/comp_algorithm"
	echo $(((bytes / 4096 + 1024) * 4096)) >"$z/disksize"
	dd if="$tmp" of=/dev/zram0 bs=1M oflag=direct status=none
	sync
	read -r orig compr used _ <"$z/mm_stat"
	awk -v a="$a" -v o="$orig" -v c="$compr" -v u="$used" \
		'BEGIN { printf "| %s | %.0f | %.0f | %.0f | %.3f |\n", a, o, c, u, o / u }'
done
