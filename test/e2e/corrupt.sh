#!/usr/bin/env bash
# Proves the end-to-end test can fail: gzramd's fault switch flips a byte
# in some of the pages it reads back, and the guest's hog must catch it.
# Exits 0 only when the test failed for exactly that reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Only a binary built with -tags faults reads GZRAMD_FAULT_*.
mkdir -p "$root/.e2e"
(cd "$root" && go build -tags faults -o .e2e/gzramd-faults ./cmd/gzramd)
export GZRAMD=$root/.e2e/gzramd-faults
export GZRAMD_FAULT_CORRUPT_READS=1 E2E_EXPECT_FAIL=1 E2E_SERVER=gzramd
export E2E_SCENARIOS=${E2E_SCENARIOS:-host-1}
exec "$(dirname "$0")/run.sh"
