#!/usr/bin/env bash
# Runs the CPU benchmarks of the codec, the page store and the device on the
# shared corpus and writes a markdown report to bench/results/.
# Usage: bench/cpu.sh [benchtime]   (default 5x); the liblz4 baselines need
# liblz4-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${1:-5x}
out=bench/results/cpu-$(hostname -s)-$(date -u +%Y%m%d).md
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT

# The baselines are liblz4's, through the tests' oracle (-tags liblz4).
if ! printf '#include <lz4.h>\n' | ${CC:-cc} -x c -E - -o /dev/null 2>/dev/null; then
	echo "bench/cpu.sh: lz4.h not found; the liblz4 baselines need liblz4-dev (apt-get install liblz4-dev)" >&2
	exit 1
fi
go test -tags liblz4 -run '^$' -bench 'LZ4Compress|Decompress|ZstdCompress' -benchtime "$benchtime" -cpu 1 ./pkg/codec | tee -a "$raw"
go test -run '^$' -bench 'BenchmarkWrite' -benchtime 20000x ./pkg/device | tee -a "$raw"
# The per-round CPU-time ratios, alternating with liblz4 on one core: what
# the speed claims rest on (the benchmarks above run one after the other).
core=$(($(nproc) - 1))
for limit in 4095 3263; do
	GZRAMD_LZ4_REPORT=1 GZRAMD_LZ4_LIMIT=$limit GZRAMD_LZ4_ROUNDS=21 taskset -c "$core" \
		go test -tags liblz4 -count=1 -run 'TestLZ4SpeedReport' -v ./pkg/codec | grep 'codec_test' | sed 's/^ *//' | tee -a "$raw"
done
GZRAMD_LZ4_REPORT=1 GZRAMD_LZ4_ROUNDS=21 taskset -c "$core" \
	go test -tags liblz4 -count=1 -run 'TestLZ4DecodeSpeedReport' -v ./pkg/codec | grep 'codec_test' | sed 's/^ *//' | tee -a "$raw"
go test -count=1 -run 'TestCorpusEffectiveRatio' -v ./pkg/device | grep 'codec ratio' | tee -a "$raw"

mbs() { awk -v pat="$1" '$1 ~ pat { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i }' "$raw" | head -1; }
ref=$(mbs 'limit=4095/liblz4-reference')
ours=$(mbs 'limit=4095/gzramd-cpubatch')
ratio() { awk -v pat="$1" '$1 ~ pat { for (i = 1; i <= NF; i++) if ($(i+1) == "ratio") print $i }' "$raw" | head -1; }
{
	echo "# CPU benchmarks, $(date -u +%Y-%m-%d)"
	echo
	echo "- commit: $(git rev-parse --short HEAD)"
	echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
	echo "- corpus: shared/corpus/memory-pages.bin.zst (23,359 pages of 4 KiB)"
	echo "- command: bench/cpu.sh $benchtime"
	echo
	echo "| measure | value |"
	echo "| --- | --- |"
	echo "| liblz4 one-shot loop (reference), one core, limit 4095 | $ref MB/s, ratio $(ratio 'limit=4095/liblz4-reference') |"
	echo "| gzramd CPU LZ4 batch path, one core, limit 4095 | $ours MB/s, ratio $(ratio 'limit=4095/gzramd-cpubatch') |"
	echo "| speed gzramd / liblz4 (benchmarks, one after the other) | $(awk -v a="$ours" -v b="$ref" 'BEGIN { printf "%.2f", a / b }') |"
	echo "| ratio at the daemon's limit (3263), gzramd / liblz4 | $(ratio 'limit=3263/gzramd-cpubatch') / $(ratio 'limit=3263/liblz4-reference') |"
	echo "| LZ4 decompression, one core, page by page | $(mbs 'BenchmarkDecompress/lz4') MB/s |"
	echo "| liblz4 decompression, one core, page by page | $(mbs '^BenchmarkDecompress/liblz4$') MB/s |"
	echo "| liblz4 decompression in one C loop (reference), one core | $(mbs 'BenchmarkDecompress/liblz4-reference') MB/s |"
	echo "| zstd-1 compression, one core | $(mbs 'BenchmarkZstdCompress') MB/s |"
	echo "| zstd-1 decompression, one core | $(mbs 'BenchmarkDecompress/zstd') MB/s |"
	for w in 1 8 32; do
		echo "| device ingest, $w writers, 4 KiB pages | $(mbs "BenchmarkWrite/writers-$w-") MB/s |"
	done
	echo
	echo "LZ4 speed per round, alternating with liblz4 on one core, by the thread's CPU time (TestLZ4SpeedReport, TestLZ4DecodeSpeedReport):"
	echo
	echo '```'
	grep 'codec_test' "$raw"
	echo '```'
	echo
	echo "Effective ratio on the whole corpus (device test):"
	echo
	echo '```'
	grep 'corpus_test' "$raw" | sed 's/^ *//'
	echo '```'
	echo
	echo "Raw output:"
	echo
	echo '```'
	grep -E '^Benchmark' "$raw"
	echo '```'
} >"$out"
echo "wrote $out"
