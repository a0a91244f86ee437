#!/usr/bin/env bash
# Tuning sweep for the compression kernel (device machine, repo root, with
# .gpucarry/ as bench/gpu/run.sh describes): builds kernelbench with other
# table sizes, ways and search caps and prints ratio and speed of each.
# NCU=1 also profiles the default with Nsight Compute.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f /tmp/pages.bin ] || .gpucarry/unzstd .gpucarry/memory-pages.bin.zst >/tmp/pages.bin
run() {
	local name=$1; shift
	nvcc -O3 -arch=sm_90 "$@" -o /tmp/kb_$name bench/gpu/kernelbench.cu --resource-usage -l:liblz4.so.1 2>&1 | grep -A3 "entry function .gz_lz4_compress" | grep -o "Used [0-9]* registers" || true
	/tmp/kb_$name /tmp/pages.bin 10 >/tmp/kb_$name.txt 2>&1; rc=$?
	echo "== $name ($*) rc=$rc: $(grep -E 'GPU ratio|compress kernel|failures' /tmp/kb_$name.txt | sed -E 's/^\| //; s/ \|$//' | tr '\n' ';')"
}
{
run default
run cap16 -DSEARCH_CAP=16
run hash10 -DHASH_BITS=10
run ways4 -DWAYS=4
run ways4-hash10-cap16 -DWAYS=4 -DHASH_BITS=10 -DSEARCH_CAP=16 -DC_WARPS=3
} 2>&1 | tee "$OUT/sweep.txt"
[ -n "${NCU:-}" ] && ncu --kernel-name gz_lz4_compress --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section InstructionStats  /tmp/kb_default /tmp/pages.bin 1 >"$OUT/ncu.txt" 2>&1
true

