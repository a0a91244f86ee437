# gzramd — see README.md. `make test` is what CI runs.
GO        ?= go
BIN       ?= bin
GOFLAGS   ?=
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
export CGO_ENABLED := 1
# The tests check gzramd's LZ4 against liblz4 (internal/lz4oracle) when
# liblz4-dev is installed: then TAGS is liblz4. Building needs no -dev
# package; test-nodeps proves it.
LZ4_ORACLE := $(shell printf '\043include <lz4.h>\nint main(void) { return LZ4_versionNumber() == 0; }\n' | \
	$(CC) -x c - -o /dev/null -l:liblz4.a >/dev/null 2>&1 && echo liblz4)
TAGS      ?= $(LZ4_ORACLE)

.PHONY: all build run test test-report test-unit test-race test-unit-all test-unit-nbd-inline test-unit-nbd-helpers test-race-all test-race-nbd-helpers vet lz4-oracle test-nodeps bench bench-footprint bench-e2e bench-takeover bench-aging bench-transports test-e2e test-survive test-systemd test-systemd-ublk test-systemd-mutants ptx install clean charts

all: build

build:
	$(GO) build $(GOFLAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/gzramd ./cmd/gzramd

# A daemon on the embedded defaults, to try gzramd: 1 GiB, a Unix socket
# in a temporary directory (removed when it stops), backend auto, metrics
# where `gzramd status` finds them (127.0.0.1:9829, else the next free
# port). It prints how to connect, the status command (with bin/gzramd:
# go install's ~/go/bin may not be on PATH) and that Ctrl-C stops it,
# which ends make run with status 0 (deploy/run.sh says how).
run: build
	@./deploy/run.sh $(BIN)/gzramd

# One line on whether the tests compare against liblz4; with
# GZRAMD_LZ4_ORACLE=required (CI) a missing oracle is an error.
lz4-oracle:
ifeq ($(findstring liblz4,$(TAGS)),liblz4)
	@echo "make: testing with -tags $(TAGS): LZ4 is checked against liblz4"
else
	@echo "make: lz4.h not found, tests against liblz4 skip (Debian package liblz4-dev: apt-get install liblz4-dev)"
	@if [ "$$GZRAMD_LZ4_ORACLE" = required ]; then echo "make: GZRAMD_LZ4_ORACLE=required but there is no liblz4 oracle" >&2; exit 1; fi
endif

# The GPU tests (tag gpu) run only on a GPU machine; vet keeps them compiling.
vet: lz4-oracle
	$(GO) vet -tags "$(TAGS)" ./...
	$(GO) vet -tags "faults,$(TAGS)" ./cmd/gzramd
	$(GO) vet -tags "gpu,$(TAGS)" ./pkg/gpu/ ./pkg/device/

# Each go test run goes through internal/testreport, which shows what go
# test shows and records every test's outcome under $(TEST_RUNS); make
# test ends with the summary of what failed, what did not run, and why,
# and what would run it (TEST_REPORT_FLAGS=-list names each test). Under
# CI=true a test skipped for want of a Debian package fails it: .ci/run
# installs them.
TEST_REPORT       := $(BIN)/testreport
TEST_RUNS         := $(BIN)/test-runs
TEST_REPORT_FLAGS ?=
GO_TEST           := $(TEST_REPORT) run -o $(TEST_RUNS)
TEST_RECORDS      := unit unit-nbd-inline unit-nbd-helpers race race-nbd-helpers

test-report:
	@mkdir -p $(TEST_RUNS)
	@$(GO) build -o $(TEST_REPORT) ./internal/testreport

# One target a go test run, so that make -k runs the others when one fails.
test-unit: test-unit-all test-unit-nbd-inline test-unit-nbd-helpers
test-race: test-race-all test-race-nbd-helpers

test-unit-all: lz4-oracle test-report
	$(GO_TEST)/unit.json -- $(GO) test -json -tags "$(TAGS)" -count=1 -timeout 30m ./...
test-unit-nbd-inline: test-report
	NBD_TEST_INLINE=1 $(GO_TEST)/unit-nbd-inline.json -- $(GO) test -json -count=1 -timeout 10m ./pkg/nbd
test-unit-nbd-helpers: test-report
	NBD_TEST_INLINE=helpers $(GO_TEST)/unit-nbd-helpers.json -- $(GO) test -json -count=1 -timeout 10m ./pkg/nbd
test-race-all: lz4-oracle test-report
	$(GO_TEST)/race.json -- $(GO) test -json -tags "$(TAGS)" -count=1 -race -short -timeout 30m ./...
test-race-nbd-helpers: test-report
	NBD_TEST_INLINE=helpers $(GO_TEST)/race-nbd-helpers.json -- $(GO) test -json -count=1 -race -short -timeout 10m ./pkg/nbd

# Every step runs, also after one fails, and the summary always ends it:
# a newcomer sees what failed beside what did not run. Records of an
# earlier make test are removed first, so that none is counted twice.
test:
	@rm -f $(addprefix $(TEST_RUNS)/,$(addsuffix .json,$(TEST_RECORDS)))
	@failed=; \
	$(MAKE) --no-print-directory -k vet || failed="$$failed vet"; \
	$(MAKE) --no-print-directory -k test-unit test-race || failed="$$failed tests"; \
	$(TEST_REPORT) summary $(if $(filter true,$(CI)),-ci) $(TEST_REPORT_FLAGS) \
		$(addprefix $(TEST_RUNS)/,$(addsuffix .json,$(TEST_RECORDS))) || failed="$$failed summary"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED ($${failed# }): see above" >&2; exit 1; fi

# Builds and unit-tests gzramd with the lz4 and zstd development files
# hidden and empty Go caches (root: it uses a mount namespace).
test-nodeps:
	./test/nodeps.sh

test-e2e: build
	./test/e2e/harness-test.sh
	./test/e2e/run.sh

# Crash survival with a real kernel (test/e2e/README.md): gzramd serves the
# guest's swap while its serving process is SIGKILLed at least 20 times,
# then the negative control (survival off) must fail. About 8 minutes
# under TCG when it passes (test/e2e/README.md: it does not always, yet).
test-survive: build
	E2E_SCENARIOS="survive survive-control" ./test/e2e/run.sh
	./test/e2e/survive-mutant.sh

# The unit under a real systemd: a Debian 12 guest whose init is systemd,
# in QEMU, installs gzramd as the README says and checks start, watchdog,
# swap, stop and reboot (test/e2e/README.md). Minutes, so not in test-e2e.
test-systemd: build
	./test/e2e/systemd.sh

# The same with GZRAMD_TRANSPORT=ublk in the unit's env file, on Debian's
# 6.12 kernel (ublk_drv): /dev/ublkbN as swap, crashes survived by ublk
# user recovery.
test-systemd-ublk: build
	E2E_SYSTEMD_TRANSPORT=ublk ./test/e2e/systemd.sh

# The same with each broken unit in test/e2e/systemd/mutants: each must fail
# at the check its file names.
test-systemd-mutants: build
	for m in test/e2e/systemd/mutants/*.conf; do E2E_SYSTEMD_DROPIN=$$m ./test/e2e/systemd.sh || exit 1; done

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 2x ./...
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) bench-footprint; \
	else echo "make: bench-footprint skipped: it needs root (it drops the page cache and uses /dev/zram0)"; fi

# What gzramd's own processes cost the machine against kernel zram's own
# (and a bare CUDA context where there is a GPU), and the swapped size
# from which gzramd saves more memory than zram (bench/footprint.sh).
bench-footprint: build
	./bench/footprint.sh

# Kill the serving process 100 times: the pause from each kill to the first
# request served again (median, 90th percentile, worst).
bench-takeover:
	GZRAMD_TAKEOVER_KILLS=$${KILLS:-100} GZRAMD_TAKEOVER_ARGS="$(ARGS)" $(GO) test -tags "$(TAGS)" -count=1 -run '^TestTakeoverPauseReport$$' -v ./cmd/gzramd | grep -E 'kills of|own count|^(ok|FAIL|---)'

bench-e2e: build
	./bench/e2e.sh

# What each transport costs the real kernel (issue 38): zram, gzramd over
# the kernel's NBD client and over ublk, in one 6.12 guest under QEMU
# (bench/transports.sh; TRANSPORTS_* knobs in its header).
bench-transports: build
	./bench/transports.sh

# The dense tier's trade: the corpus through NBD, the ratio and QD1 reads
# before and after aging, against kernel zram (bench/aging.sh; zram needs root).
bench-aging: build
	./bench/aging.sh

# Needs nvcc (CUDA 12+); the generated PTX is committed so users need only the driver.
ptx:
	$(MAKE) -C kernels

# The env file is the user's settings: installed once, never overwritten.
install: build
	install -D -m 0755 $(BIN)/gzramd $(DESTDIR)/usr/local/bin/gzramd
	install -D -m 0644 deploy/systemd/gzramd.service $(DESTDIR)/etc/systemd/system/gzramd.service
	[ -e $(DESTDIR)/etc/gzramd/gzramd.env ] || install -D -m 0644 deploy/systemd/gzramd.env $(DESTDIR)/etc/gzramd/gzramd.env

# The README's two charts (docs/memory-saved.svg, docs/cpu-per-gb.svg),
# drawn from bench/results/memory-saved.csv and trace-cpu-per-gb.csv by a
# standard-library Go program.
charts:
	$(GO) run ./bench/charts -results bench/results -out docs

clean:
	rm -rf $(BIN)
