#!/usr/bin/env bash
# First-look script for the device machine: builds the PTX and the kernel
# benchmark, prints resource usage and runs the checks.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/smi.txt"
./kernels/build-ptx.sh lz4.cu && cp kernels/lz4.ptx "$OUT/"
nvcc -O3 -arch=sm_90 --resource-usage -o /tmp/kernelbench bench/gpu/kernelbench.cu -l:liblz4.so.1 2>&1 | grep -v '^$' | tee "$OUT/build.txt"
.gpucarry/unzstd .gpucarry/memory-pages.bin.zst >/tmp/pages.bin
/tmp/kernelbench /tmp/pages.bin 10 2>&1 | tee "$OUT/kernelbench.txt"
grep -n 'cuEventElapsedTime\|define cuMemHostAlloc\|define cuMemcpyHtoDAsync\|define cuStreamDestroy\|define cuMemAlloc \|define cuDevicePrimaryCtxRelease\|CUresult CUDAAPI cuLaunchKernel(' /usr/local/cuda/include/cuda.h | head -20
