# gzramd — see README.md. `make test` is what CI runs.
GO        ?= go
BIN       ?= bin
GOFLAGS   ?=
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
export CGO_ENABLED := 1

.PHONY: all build run test test-unit test-race vet bench bench-e2e test-e2e test-systemd test-systemd-mutants ptx install clean

all: build

build:
	$(GO) build $(GOFLAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/gzramd ./cmd/gzramd

# A daemon on the embedded defaults: 1 GiB, a Unix socket in a temporary
# directory, backend auto.
run: build
	@dir=$$(mktemp -d /tmp/gzramd.XXXXXX); \
	echo "gzramd: socket $$dir/gzramd.sock — connect with: nbdinfo 'nbd+unix:///gzram0?socket=$$dir/gzramd.sock'"; \
	exec $(BIN)/gzramd serve --socket $$dir/gzramd.sock --metrics 127.0.0.1:9829

vet:
	$(GO) vet ./...

test-unit:
	$(GO) test -count=1 -timeout 30m ./...
	NBD_TEST_INLINE=1 $(GO) test -count=1 -timeout 10m ./pkg/nbd
	NBD_TEST_INLINE=helpers $(GO) test -count=1 -timeout 10m ./pkg/nbd

test-race:
	$(GO) test -count=1 -race -short -timeout 30m ./...
	NBD_TEST_INLINE=helpers $(GO) test -count=1 -race -short -timeout 10m ./pkg/nbd

test: vet test-unit test-race

test-e2e: build
	./test/e2e/run.sh

# The unit under a real systemd: a Debian 12 guest whose init is systemd,
# in QEMU, installs gzramd as the README says and checks start, watchdog,
# swap, stop and reboot (test/e2e/README.md). Minutes, so not in test-e2e.
test-systemd: build
	./test/e2e/systemd.sh

# The same with each broken unit in test/e2e/systemd/mutants: each must fail
# at the check its file names.
test-systemd-mutants: build
	for m in test/e2e/systemd/mutants/*.conf; do E2E_SYSTEMD_DROPIN=$$m ./test/e2e/systemd.sh || exit 1; done

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./...

bench-e2e: build
	./bench/e2e.sh

# Needs nvcc (CUDA 12+); the generated PTX is committed so users need only the driver.
ptx:
	$(MAKE) -C kernels

# The env file is the user's settings: installed once, never overwritten.
install: build
	install -D -m 0755 $(BIN)/gzramd $(DESTDIR)/usr/local/bin/gzramd
	install -D -m 0644 deploy/systemd/gzramd.service $(DESTDIR)/etc/systemd/system/gzramd.service
	[ -e $(DESTDIR)/etc/gzramd/gzramd.env ] || install -D -m 0644 deploy/systemd/gzramd.env $(DESTDIR)/etc/gzramd/gzramd.env

clean:
	rm -rf $(BIN)
