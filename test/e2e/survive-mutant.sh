#!/usr/bin/env bash
# Proves the survive scenario notices a lost page: gzramd built with
# -tags faults and run in the guest with GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER=1
# (each serving process that took the device over from one that died loses
# the first non-zero page it reads: the reply is zeroes and the stored page
# is dropped) must make the
# survive-mutant scenario (survive-fast's kills and upgrade) fail: the hog
# finds the wrong words. Exits 0 only when the run failed for exactly that
# (run.sh's survive-mutant). E2E_SURVIVE_MUTANT_ENV names another switch.
# The loss must be durable (the stored page dropped, not only the reply
# zeroed): a zeroed reply alone often goes to a page nobody reads (a
# readahead page reclaimed before use; the re-read gets the intact page),
# and the run passes (seen 2026-11-26: 3 faults, HOG-PASS).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Only a binary built with -tags faults reads GZRAMD_FAULT_*.
mkdir -p "$root/.e2e"
if [ -z "${GZRAMD:-}" ]; then
	(cd "$root" && go build -tags faults -o .e2e/gzramd-faults ./cmd/gzramd)
	export GZRAMD=$root/.e2e/gzramd-faults
fi
# With the argument ublk, over ublk: survive-mutant-ublk, in a 6.12 guest.
export E2E_SCENARIOS=survive-mutant${1:+-$1}
exec "$(dirname "$0")/run.sh"
