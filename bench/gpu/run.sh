#!/usr/bin/env bash
# GPU backend check and benchmark. Runs ON a machine with an NVIDIA GPU and
# nvcc, from the repository root, with .gpucarry/ prepared on a build host:
#
#   go test -c -tags gpu,liblz4 -o .gpucarry/gpu.test ./pkg/gpu   # liblz4: the oracle, needs liblz4-dev
#   go build -o .gpucarry/unzstd bench/gpu/unzstd.go
#   cp ../shared/corpus/memory-pages.bin.zst .gpucarry/
#   git rev-parse --short HEAD >.gpucarry/COMMIT
#
# It rebuilds kernels/lz4.ptx, checks and times the kernels against liblz4
# (bench/gpu/kernelbench.cu), runs the Go GPU tests with that PTX, measures
# end-to-end throughput and the GPU/CPU crossover, and writes results.md
# (plus logs and the PTX) to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gzramd-gpu-bench}
mkdir -p "$OUT"
C=.gpucarry
commit=$(cat "$C/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
nvccv=$(nvcc --version | grep -o 'release [0-9.]*' | head -1)

./kernels/build-ptx.sh lz4.cu && cp kernels/lz4.ptx "$OUT/lz4.ptx" || { echo "PTX build failed"; exit 1; }
[ -f /tmp/pages.bin ] || "$C/unzstd" "$C/memory-pages.bin.zst" >/tmp/pages.bin

nvcc -O3 -arch=native -o /tmp/kernelbench bench/gpu/kernelbench.cu -l:liblz4.so.1 || exit 1
/tmp/kernelbench /tmp/pages.bin 10 >"$OUT/kernel.md" 2>"$OUT/kernel.err"
krc=$?

export GZRAMD_PTX=kernels/lz4.ptx GZRAMD_CORPUS=$C/memory-pages.bin.zst
"$C/gpu.test" -test.v -test.count=1 -test.timeout=6m >"$OUT/gpu-test.log" 2>&1
trc=$?
GZRAMD_BENCH_OUT=/tmp/e2e.md "$C/gpu.test" -test.run '^TestBenchReport$' -test.v -test.timeout=5m >"$OUT/bench.log" 2>&1
brc=$?

{
	echo "# GPU backend results: $device"
	echo
	echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "- commit: $commit"
	echo "- device: $device, driver $driver, nvcc $nvccv, $(nproc) CPU cores"
	echo "- reproduce: see bench/gpu/run.sh (build .gpucarry on a Go host, run the script on the GPU host)"
	echo
	echo "## Kernels, data already on the GPU (bench/gpu/kernelbench.cu, CUDA events, median of 10, whole corpus per run)"
	echo
	cat "$OUT/kernel.md"
	echo
	echo "kernelbench exit status: $krc"
	echo
	echo "## Go GPU tests (go test -tags gpu ./pkg/gpu), exit status $trc"
	echo
	echo '```'
	grep -E '^(=== RUN|--- |PASS|FAIL|ok)' "$OUT/gpu-test.log" | grep -v '^=== RUN' | head -60
	grep -E 'GPU ratio|device:' "$OUT/gpu-test.log" | head -5
	echo '```'
	echo
	echo "## End to end and crossover (TestBenchReport), exit status $brc"
	echo
	cat /tmp/e2e.md 2>/dev/null
} >"$OUT/results.md"
cat "$OUT/results.md"
[ $krc -eq 0 ] && [ $trc -eq 0 ] && [ $brc -eq 0 ]
