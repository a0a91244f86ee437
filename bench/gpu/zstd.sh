#!/usr/bin/env bash
# The zstd kernel's check and timing, in one call on a machine with an
# NVIDIA GPU and nvcc, from the repository root, with .gpucarry/ prepared
# on a build host as run.sh says (gpu.test, unzstd, the corpus).
#
# It rebuilds kernels/zstd.ptx (copied to $OUT), runs the Go GPU tests of
# the zstd kernel with it (every frame of the corpus and the edge pages
# decoded by libzstd), times the kernel with bench/gpu/zstdbench.cu (the
# corpus' first 16,384 pages, data on the GPU) as built and in each variant
# of ZSTD_VARIANTS (flag sets separated by ";", e.g. "-DZW_REPS=2;-DZW_CAP=32"),
# prints where lane 0's cycles go (-DZW_PROFILE), and, with ZSTD_E2E=1,
# the end-to-end report (TestZstdBenchReport). With ZSTD_NCU=1 Nsight
# Compute's warp-state and occupancy sections of each kernel go to
# $OUT/ncu-<kernel>.txt. Six files at most come back in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gzramd-zstd}
mkdir -p "$OUT"
C=.gpucarry
rc=0
./kernels/build-ptx.sh zstd.cu >/dev/null && cp kernels/zstd.ptx "$OUT/zstd.ptx" || { echo "PTX build failed"; exit 1; }
[ -f /tmp/pages.bin ] || "$C/unzstd" "$C/memory-pages.bin.zst" >/tmp/pages.bin

variants=("" "-DZW_PROFILE")
IFS=';' read -r -a extra <<<"${ZSTD_VARIANTS:-}"
variants+=("${extra[@]}")
i=0
for v in "${variants[@]}"; do
	# shellcheck disable=SC2086
	nvcc -O3 -arch=native $v -o "/tmp/zstdbench$i" bench/gpu/zstdbench.cu 2>"/tmp/nvcc$i.err" &
	i=$((i + 1))
done
wait
{
	echo "# zstd kernel: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%dT%H:%MZ), $(cat "$C/COMMIT" 2>/dev/null || echo unknown)"
	i=0
	for v in "${variants[@]}"; do
		echo
		echo "## zstdbench ${v:-(as built)}"
		if [ -x "/tmp/zstdbench$i" ]; then
			"/tmp/zstdbench$i" /tmp/pages.bin 16384 || rc=1
		else
			echo "build failed:"
			head -20 "/tmp/nvcc$i.err"
			rc=1
		fi
		i=$((i + 1))
	done
} 2>&1 | tee "$OUT/zstdbench.md"

export GZRAMD_ZSTD_PTX=kernels/zstd.ptx GZRAMD_CORPUS=$C/memory-pages.bin.zst
"$C/gpu.test" -test.run 'Zstd' -test.v -test.count=1 -test.timeout=6m >"$OUT/gpu-test.log" 2>&1 || rc=1
echo
grep -E '^(--- |PASS|FAIL|ok)|ratio GPU zstd' "$OUT/gpu-test.log" | head -30
if [ "${ZSTD_E2E:-0}" = 1 ]; then
	GZRAMD_BENCH_OUT="$OUT/e2e.md" "$C/gpu.test" -test.run '^TestZstdBenchReport$' -test.v -test.timeout=5m >/tmp/e2e.log 2>&1 || {
		rc=1
		tail -20 /tmp/e2e.log
	}
	cat "$OUT/e2e.md"
fi
if [ "${ZSTD_NCU:-0}" = 1 ]; then
	for k in gz_zstd_parse gz_zstd_encode; do
		ncu --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
			--section ComputeWorkloadAnalysis -k $k -c 1 /tmp/zstdbench0 /tmp/pages.bin 8192 >"$OUT/ncu-$k.txt" 2>&1
		echo "$k:"
		grep -E 'Warp Cycles Per Issued|Achieved Active Warps|Block Limit (Reg|Shared)|Registers Per|Issued Ipc Active|No Eligible|Active Threads' "$OUT/ncu-$k.txt"
		grep -B1 -A2 'stalled' "$OUT/ncu-$k.txt" | grep -oE 'each warp of this workload spends [0-9.]+ cycles being stalled [a-z ]+' | head -3
	done
fi
exit $rc
