// `gzramd serve`: its flags, their validation, and the start-up order.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbddev"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/serving"
	"github.com/gzramd/gzramd/pkg/supervise"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// systemSocketDir is the default socket's directory for root, and for
// anyone who may write there.
const systemSocketDir = "/run/gzramd"

// defaultSocket is where gzramd serves NBD unless --socket says otherwise:
// systemd's RuntimeDirectory for the unit; /run/gzramd for root; and for
// an ordinary user, who cannot write there, a directory in their own
// runtime directory ($XDG_RUNTIME_DIR, which a login session has), so that
// a first `gzramd serve` works without root.
func defaultSocket() string {
	mayWriteSystem := os.Geteuid() == 0 || unix.Access(systemSocketDir, unix.W_OK) == nil
	return socketFor(os.Getenv("RUNTIME_DIRECTORY"), os.Getenv("XDG_RUNTIME_DIR"), mayWriteSystem)
}

func socketFor(runtimeDir, xdgRuntimeDir string, mayWriteSystem bool) string {
	switch {
	case runtimeDir != "":
		// systemd may list several directories, colon-separated.
		return filepath.Join(strings.Split(runtimeDir, ":")[0], "gzramd.sock")
	case !mayWriteSystem && xdgRuntimeDir != "":
		return filepath.Join(xdgRuntimeDir, "gzramd", "gzramd.sock")
	}
	return filepath.Join(systemSocketDir, "gzramd.sock")
}

// socketDir makes sure --socket's directory is there before anything
// starts. Only the default's directory is created: a mistyped path fails
// with its name, and leaves no directories behind.
func socketDir(path, defaultPath string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	if path == defaultPath {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cannot create %s for the default --socket (%v): pass --socket PATH in a directory you may write, e.g. --socket /tmp/gzramd.sock, or set XDG_RUNTIME_DIR", dir, errors.Unwrap(err))
		}
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("invalid --socket %s: the directory %s does not exist (gzramd creates only the default's, %s)", path, dir, filepath.Dir(defaultPath))
	case err != nil:
		return fmt.Errorf("invalid --socket %s: %w", path, err)
	case !fi.IsDir():
		return fmt.Errorf("invalid --socket %s: %s is not a directory", path, dir)
	case unix.Access(dir, unix.W_OK|unix.X_OK) != nil:
		return fmt.Errorf("invalid --socket %s: this user may not create files in %s", path, dir)
	}
	return nil
}

func newServeCmd() *cobra.Command {
	return serveCmd(&serving.Config{Size: 1 << 30, GoMemoryLimit: 512 << 20, Prefault: 16 << 20, Staging: pipeline.DefaultStagingBytes})
}

// serveCmd binds the flags of `gzramd serve` to cfg, which holds the defaults.
func serveCmd(cfg *serving.Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Run the daemon in the foreground",
		Long:    serveLong,
		Example: serveExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return usageErr(err)
			}
			cfg.Plan = machinePlan()
			if !cmd.Flags().Changed("prefault") {
				cfg.Prefault = serving.Size(cfg.Plan.Prefault)
			}
			return runServe(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	serveFlags(f, cfg)
	compressionFlags(f, cfg)
	kernelFlags(f, cfg)
	processFlags(f, cfg)
	return cmd
}

// serveFlags binds the flags of what is served and where: the device's
// size and memory, the NBD socket and TCP address with TLS, the export,
// the metrics endpoint, the log level.
func serveFlags(f *pflag.FlagSet, cfg *serving.Config) {
	f.Var((*sizeValue)(&cfg.Size), "size", "device size (e.g. 8GiB); a multiple of 4KiB")
	f.Var((*sizeValue)(&cfg.MemLimit), "mem-limit", "most memory the compressed pages may use (e.g. 2GiB); 0 means no limit; writes past it fail with ENOSPC")
	f.Var((*sizeValue)(&cfg.Prefault), "prefault", "store memory kept faulted in ahead of use, so storing a swapped-out page never waits for a page fault that needs swap (0 to fault lazily); by default at most 1/32 of RAM; once no write has come for 5 s, what is above twice the most the last writes took in 100 ms is given back, keeping between an eighth and half of it")
	f.StringVar(&cfg.Socket, "socket", defaultSocket(), "Unix socket to serve NBD on (mode 0600); empty to disable. By default "+systemSocketDir+"/gzramd.sock as root, $RUNTIME_DIRECTORY/gzramd.sock under systemd, $XDG_RUNTIME_DIR/gzramd/gzramd.sock for a user who may not write "+systemSocketDir+"; only the default's directory is created")
	f.StringVar(&cfg.TCP, "tcp", "", "TCP address to serve NBD on, e.g. 127.0.0.1:10809 (a bare :PORT means loopback); off by default")
	tlsFlags(f, cfg)
	f.StringVar(&cfg.Export, "export", "gzram0", "export name; the empty name reaches it too")
	f.StringVar(&cfg.Metrics, "metrics", "127.0.0.1:9829", "address for the HTTP endpoint serving /metrics (Prometheus) and /status; empty to disable")
	f.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
}

// compressionFlags binds the flags of how pages are compressed: the
// backend and algorithm, the GPU's staged batches, objects of several
// pages, the dense tier.
func compressionFlags(f *pflag.FlagSet, cfg *serving.Config) {
	f.StringVar(&cfg.Backend, "backend", "auto", "compression backend: auto (the GPU when one is usable and the device is 8GiB or more, else the CPU: the GPU's own memory, about 150MiB, pays for itself in CPU time only where much is swapped), gpu (required, any size) or cpu")
	f.StringVar(&cfg.Algorithm, "algorithm", "lz4", "compression algorithm: lz4 (fast) or zstd, which stores 1.43x what lz4 stores in the same memory (ratio 3.38 against 2.36 on the corpus of real memory pages). Compressing zstd costs about lz4's CPU on the GPU and about 3x lz4's on the CPU; a swap-in costs 1.3-1.45x lz4's CPU with the GPU, 2.3x without (the whole machine, per GB, on a recorded swap trace)")
	f.DurationVar(&cfg.StagingWait, "staging-wait", 0, "with the GPU: how long a write that finds --staging full waits for room before it compresses on the CPU; 0: the algorithm's default (20ms with zstd, whose CPU codec costs 29 times the GPU's CPU; none with lz4), negative: never wait")
	f.Var((*sizeValue)(&cfg.Staging), "staging", "with the GPU: write-behind memory (pinned, locked, counted in mem_used at 4KiB a page). A write is acknowledged once its pages are copied here; the GPU compresses them in batches nobody waits for. When it is full, writes wait up to --staging-wait for room, then compress inline on the CPU. At least --batch-inflight+1 batches; 0 turns write-behind off (and with it the GPU)")
	f.IntVar(&cfg.BatchPages, "batch-pages", pipeline.DefaultBatchPages, "pages in one staged batch, the most the GPU takes at once")
	f.DurationVar(&cfg.BatchDeadline, "batch-deadline", pipeline.DefaultBatchDeadline, "longest a staged page waits for its batch to fill before the batch goes to compression anyway. Longer makes fewer, larger batches: with one writer of 4 KiB pages 4ms cost 12-21 % less CPU per GB than 1ms on an H100 machine, but 10 % more on a recorded swap trace")
	f.IntVar(&cfg.BatchInFlight, "batch-inflight", pipeline.DefaultBatchWorkers, "staged batches compressing at once (the GPU's streams)")
	f.IntVar(&cfg.HugeThreshold, "huge-threshold", device.DefaultHugeThreshold, "pages that compress to this many bytes or more are stored raw (1-4096)")
	f.IntVar(&cfg.ObjectPages, "object-pages", 1, "keep the adjacent pages of a write compressed together, on the CPU or the GPU, as one object of up to this many pages (1, 2, 4, 8 or 16; 1 keeps each page alone): one LZ4 block, or with --algorithm zstd one zstd frame of a block a page. On the shared corpus of real memory pages, on the GPU, 4 stored 9 % more than 1 with lz4 and 8 % with zstd, 16 stored 14 % and 12 % more (zstd: 3.9 times the pages' size, above kernel zram's best), at the cost of decoding the object up to the page for a read of one of its pages (a 4KiB read's p99 over NBD on an H100 machine, lz4: 1.10 times as long with 4, 1.39 times with 16). The GPU compresses an object with one warp: objects of 16 pages at about 0.8 GB/s a batch in flight, of 4 at 2.6, pages alone at 6-7")
	f.DurationVar(&cfg.DenseAfter, "dense-after", 5*time.Minute, "recompress the pages of each group of 16 (64 KiB of the device) that nobody has read or written for this long, harder, as zstd frames of 4 pages: the dense tier. With --backend gpu the GPU recompresses, a frame a group (about 0.9 CPU-s per GB recompressed); on the CPU about 10 CPU-s per GB at --dense-level 5, within --dense-cpu. On the shared corpus of real memory pages it stores 3.91 times the pages' size after aging, against 2.36 with lz4 pages alone and 2.40 for kernel zram's default lzo-rle; a 4 KiB read of such a page decodes its 16 KiB frame: about 2.5 times as long as a read of an lz4 page through NBD. A page written again leaves it. 0 turns the tier off")
	f.IntVar(&cfg.DenseLevel, "dense-level", 5, "the zstd level of the dense tier's frames on the CPU, 1 to 19: each step up stores a little more for more recompression CPU, and reads cost the same (16 KiB frames of the shared corpus: 4 stores 3.97 at 178 MB/s of a core, 5 4.03 at 137 MB/s, 6 4.05 at 86 MB/s, 9 4.07 at 31 MB/s, 19 about 6 % more than 5 at 3 MB/s)")
	f.Float64Var(&cfg.DenseCPU, "dense-cpu", 0.1, "the share of one CPU the dense tier's recompressor may use (0.01 to 1); it sleeps in proportion to its work (its waits for the GPU do not count)")
	f.IntVar(&cfg.GPUDevice, "gpu-device", 0, "CUDA device index for the GPU backend")
	f.IntVar(&cfg.GPUMinPages, "gpu-min-pages", route.DefaultMinAcceleratorPages, "smallest staged batch sent to the GPU; smaller ones (light load, sealed by --batch-deadline) compress on the CPU, which costs the CPU less for so few pages")
}

// kernelFlags binds the flags of the kernel device gzramd attaches, swap
// on it, and the connections of other clients.
func kernelFlags(f *pflag.FlagSet, cfg *serving.Config) {
	f.StringVar(&cfg.Device, "device", "", "attach this kernel device to the export: /dev/nbdN, or auto for any free one (needs root and the nbd module); with --transport ublk only auto (the driver numbers /dev/ublkbN)")
	f.StringVar(&cfg.Transport, "transport", serving.TransportNBD, "how the kernel device (--device, --swap) is served: nbd (attach /dev/nbdN to the export through the nbd module), ublk (create /dev/ublkbN and serve it through ublk_drv, no socket: Linux 6.5+, root, modprobe ublk_drv) or auto (ublk where /dev/ublk-control opens, else nbd). Under the supervisor a ublk device outlives a dead or upgraded serving process and the next takes it over (ublk user recovery), as an NBD device does; without it (--supervise=false) the device goes with the process. nbd stays the default while ublk's takeover is new. The NBD socket and TCP export serve alongside either way")
	f.BoolVar(&cfg.Swap, "swap", false, "make the device swap: attach --device (auto if unset), mkswap, swapon --discard; swapoff and detach on stop")
	f.IntVar(&cfg.SwapPriority, "swap-priority", 100, "swap priority for --swap (-1 for the kernel's default); above disk swap so it fills first")
	f.IntVar(&cfg.KernelConns, "kernel-connections", 1, "sockets the kernel device spreads requests over (1-16)")
	f.IntVar(&cfg.UblkDepth, "ublk-depth", 64, "with --transport ublk: requests each of the device's queues (one per CPU, at most 4) holds at once, 1-4096; the kernel waits for a free one beyond it. Each costs 8 bytes of the driver's descriptors, not memory of gzramd's: a queue serves one request at a time")
	f.IntVar(&cfg.MaxConns, "max-connections", 8, "NBD connections open at once from clients other than the kernel device (nbdinfo, nbdcopy, fio, nbd-client run by hand), handshakes included; 0 for no limit. Each one holds memory (with --harden, its payload buffers, about 4MiB, written and locked), so without a limit any user who may connect can make the daemon that serves the machine's swap lock memory until the machine runs out. 8 leaves room for nbdcopy's 4 connections and a few tools beside, in about 36MiB. A connection past it is closed at once, logged with its client (the peer's address over TCP, its user on the Unix socket; a line per client per 10s at most) and counted in gzramd_nbd_connections_refused_total. The kernel device's own connections (--kernel-connections, reconnects, those taken over at an upgrade or after a crash) never count and are never refused: gzramd dials them itself, which the Unix socket tells (SO_PEERCRED). Over TCP nothing tells them apart: with --device and no --socket the limit grows by --kernel-connections, and other clients may take those places")
	f.DurationVar(&cfg.KernelTimeout, "kernel-timeout", 0, "the kernel's per-request timeout for --device (whole seconds; 0: "+nbddev.DefaultTimeout.String()+"): a request in flight when the serving process dies is sent again to the next one after this long, and a request slower than this costs its connection (gzramd replaces it)")
	f.DurationVar(&cfg.KernelDeadTimeout, "kernel-dead-timeout", nbddev.DefaultDeadConnTimeout, "how long the kernel device holds its I/O while no serving process is connected (after a crash, until the supervisor's next one takes over) before failing it; -1s fails it at once, losing what is swapped there (over ublk: the device holds it with no limit, or with -1s is made without recovery)")
	f.BoolVar(&cfg.Force, "force", false, "stop on SIGTERM even while the export is active swap that gzramd did not turn on (the swapped memory is lost)")
}

// processFlags binds the flags of how the serving process runs: its
// hardening, NBD's inline requests, the trace, the supervisor, the Go
// runtime.
func processFlags(f *pflag.FlagSet, cfg *serving.Config) {
	f.BoolVar(&cfg.Harden, "harden", true, "make the process fit to serve swap: mlockall, IO flusher threads, real-time scheduling, oom_score_adj -1000")
	f.BoolVar(&cfg.Reexec, "io-flusher-reexec", true, "re-execute once so every thread inherits PR_SET_IO_FLUSHER (with --harden)")
	f.StringVar(&cfg.NBDInline, "nbd-inline", "auto", "run each NBD request of up to 64 KiB on its connection's reader, one at a time per connection, replies sent together (no request waits for a batch: with the GPU, writes are staged): on, off, or auto (on)")
	f.IntVar(&cfg.NBDInlineHelpers, "nbd-inline-helpers", -1, "with --nbd-inline, run the requests a connection read together on this many goroutines besides its reader (0 to 16); -1 (auto) is one per 4 CPUs beyond the first 4, at most 3. On 16 CPUs, 0 spent 5-13 % less CPU per GB than 3 and moved 4-17 % less under load")
	f.StringVar(&cfg.Realtime, "realtime", "auto", "run every thread SCHED_RR at priority 1 (with --harden; needs CAP_SYS_NICE), so that gzramd's own allocations (a reply's socket buffer) may dip below the kernel's min watermark while it stores swapped pages: on, off, or auto (on when gzramd attaches the kernel device itself, --device or --swap). It costs throughput to clients on the same CPUs; with the GPU backend only if its waits can be made to block, as they are at start")
	f.BoolVar(&cfg.RequireHardening, "require-hardening", false, "fail at start when a hardening step fails, instead of logging it")
	f.Var((*sizeValue)(&cfg.GoMemoryLimit), "go-memory-limit", "soft limit for the Go heap (buffers, not the compressed pages); 0 leaves the runtime's (GOMEMLIMIT wins)")
	f.StringVar(&cfg.RecordTrace, "record-trace", "", "write every NBD request received to this file as a fio iolog (version 2), to replay the workload later: "+
		"reads, writes and trims as such, flushes as sync, write-zeroes as trims (fio has no write-zeroes; on a RAM device both leave zeroes and free the range; fio replays trims from 3.34 on). "+
		"Replay it, on a device at least as large, through gzramd's socket with fio --name=replay --ioengine=nbd --uri='nbd+unix:///gzram0?socket=SOCKET' --read_iolog=FILE --replay_no_stall=1 --iodepth=32, "+
		"or on a block device with --ioengine=libaio --direct=1 --replay_redirect=/dev/DEVICE; bench/trace.sh replays one on gzramd, kernel zram and nbdkit. "+
		"The file is replaced, and closed with fio's close line on SIGTERM. Recording never makes a request wait: requests arriving while the writer is a whole ring (64Ki requests) behind are left out, "+
		"counted in gzramd_trace_dropped_records_total and logged")
	f.BoolVar(&cfg.Supervise, "supervise", true, "run the serving process under a small supervisor that holds the device's memory (in memfds, locked) and, when the serving process dies, starts another that takes the memory and the kernel device over: swapped pages survive a crash. Off, the device's memory goes with the process")
	f.BoolVar(&cfg.Standby, "standby", true, "with --supervise, keep the next serving process started ahead, hardened and its memory locked, so that a crash is taken over by a process that needs no memory at the moment the kernel's reclaim is stuck on the device")
	f.IntVar(&cfg.GCPercent, "gc-percent", 0, "Go GC target percentage (GOGC); 0 leaves it to gzramd: 10 with --harden, which paces the collector around the heap reserve kept resident (8MiB), else the runtime's")
}

// serveLong is `gzramd serve`'s help text.
const serveLong = `Run the daemon in the foreground: create the compressed device and serve it
over NBD on a Unix socket (and TCP, if asked) until SIGINT or SIGTERM.
Pages are kept as LZ4 blocks (--algorithm lz4) or zstd frames (--algorithm
zstd, which stores 1.43x what lz4 stores in the same memory: ratio 3.38
against 2.36 on the corpus of real memory pages; a swap-in costs 1.3-1.45x
lz4's CPU with the GPU, 2.3x without), compressed on the GPU (--backend)
or the CPU. Prometheus metrics and a JSON status report (read by "gzramd
status") are served on --metrics.

Every flag can also be set from the environment as GZRAMD_<FLAG>, upper case
with dashes as underscores (GZRAMD_SIZE=8GiB, GZRAMD_MEM_LIMIT=2GiB,
GZRAMD_SWAP=true); a flag on the command line wins.

Swap: --swap attaches a kernel /dev/nbdN to the export, formats it and turns
it on with discard; on SIGTERM gzramd turns it off (the kernel reads every
swapped page back first) and detaches. If the export is active swap that
gzramd did not turn on itself, it refuses to stop (it would take the
swapped memory with it) until that swap is off, unless --force.

--transport ublk serves the kernel device through ublk instead: gzramd
creates /dev/ublkbN itself (Linux 6.5+, root, modprobe ublk_drv) and
--swap makes it swap as above. Under the supervisor the device outlives
a serving process that dies or is upgraded: the kernel holds its requests
until the next serving process takes it over. Not the default yet: that
takeover is new. --transport auto picks ublk where it is usable, else
nbd.

Connect the kernel by hand (then start gzramd with --realtime on) with
  nbd-client -unix /run/gzramd/gzramd.sock /dev/nbd0 -N gzram0 -b 4096 -swap
  mkswap /dev/nbd0 && swapon --discard /dev/nbd0
and set vm.min_free_kbytes=16384 (or more): swap over NBD needs free memory
for the socket path while the kernel reclaims.

Hardening (on by default, each step logged, none fatal unless
--require-hardening): mlockall, PR_SET_IO_FLUSHER on every thread (by
re-executing itself once), SCHED_RR at priority 1 when gzramd attaches
the kernel device itself (--realtime), oom_score_adj -1000, a Go memory
limit; and what serving needs (heap, threads, code, NBD buffers) faulted
in before the device becomes swap. Without root, the steps that need it
are summed up in one INFO line (fine for trying gzramd, not for swap);
only when the export is swap (--swap, --device, --realtime on) is each a
WARN.`

const serveExample = `  gzramd serve --size 8GiB --mem-limit 4GiB
  gzramd serve --socket /tmp/gz.sock --tcp 127.0.0.1:10809 --backend cpu
  gzramd serve --size 16GiB --swap                 # as root: becomes swap
  gzramd serve --swap --transport ublk             # swap over ublk, taken over after a crash
  GZRAMD_SIZE=4GiB GZRAMD_BACKEND=cpu gzramd serve`

// validate checks every flag before anything starts, so that a bad value
// stops the daemon with one line naming the flag. The checks run in the
// order of the flags' groups, the first bad value named.
func validate(c *serving.Config) error {
	for _, check := range []func(*serving.Config) error{
		validateServing, validateCompression, validateKernel, validateRuntime, validateAddresses,
	} {
		if err := check(c); err != nil {
			return err
		}
	}
	if c.Swap && c.Device == "" {
		c.Device = "auto"
	}
	return nil
}

// validateServing checks the device's size and memory, how NBD requests
// run, and that there is somewhere to serve.
func validateServing(c *serving.Config) error {
	switch {
	case c.Size <= 0 || c.Size%codec.PageSize != 0:
		return fmt.Errorf("invalid --size %s: want a positive multiple of 4KiB, e.g. 1GiB", c.Size.String())
	case int64(c.Size) > device.MaxSize:
		return fmt.Errorf("invalid --size %s: the largest device is %s", c.Size.String(), formatSize(device.MaxSize))
	case c.MemLimit < 0:
		return fmt.Errorf("invalid --mem-limit %s: want a size such as 2GiB, or 0 for no limit", c.MemLimit.String())
	case c.NBDInline != "auto" && c.NBDInline != "on" && c.NBDInline != "off":
		return fmt.Errorf("invalid --nbd-inline %q: want auto, on or off", c.NBDInline)
	case c.NBDInlineHelpers < -1 || c.NBDInlineHelpers > nbd.MaxInlineHelpers:
		return fmt.Errorf("invalid --nbd-inline-helpers %d: want 0 to %d, or -1 for auto", c.NBDInlineHelpers, nbd.MaxInlineHelpers)
	case c.Realtime != "auto" && c.Realtime != "on" && c.Realtime != "off":
		return fmt.Errorf("invalid --realtime %q: want auto, on or off", c.Realtime)
	case c.Prefault < 0 || c.Prefault > 1<<30:
		return fmt.Errorf("invalid --prefault %s: want a size from 0 to 1GiB, e.g. 16MiB", c.Prefault.String())
	case c.Socket == "" && c.TCP == "":
		return errors.New("nothing to serve on: give --socket PATH or --tcp ADDR")
	}
	return nil
}

// validateCompression checks the backend, the algorithm, the staged
// batches, objects of several pages and the dense tier.
func validateCompression(c *serving.Config) error {
	switch {
	case c.Backend != "auto" && c.Backend != "gpu" && c.Backend != "cpu":
		return fmt.Errorf("invalid --backend %q: want auto, gpu or cpu", c.Backend)
	case c.Algorithm != "lz4" && c.Algorithm != "zstd":
		return fmt.Errorf("invalid --algorithm %q: want lz4 or zstd", c.Algorithm)
	case c.Staging == 0 && c.Backend == "gpu":
		return errors.New("invalid --backend gpu with --staging 0: the GPU compresses staged writes only")
	case c.BatchPages < 1 || c.BatchPages > 65536:
		return fmt.Errorf("invalid --batch-pages %d: want 1 to 65536", c.BatchPages)
	case c.BatchDeadline <= 0 || c.BatchDeadline > time.Second:
		return fmt.Errorf("invalid --batch-deadline %v: want a duration from 1µs to 1s, e.g. 1ms", c.BatchDeadline)
	case c.BatchInFlight < 1 || c.BatchInFlight > 64:
		return fmt.Errorf("invalid --batch-inflight %d: want 1 to 64", c.BatchInFlight)
	case c.HugeThreshold < 1 || c.HugeThreshold > codec.PageSize:
		return fmt.Errorf("invalid --huge-threshold %d: want 1 to 4096", c.HugeThreshold)
	case c.ObjectPages < 1 || c.ObjectPages > 16 || c.ObjectPages&(c.ObjectPages-1) != 0:
		return fmt.Errorf("invalid --object-pages %d: want 1, 2, 4, 8 or 16", c.ObjectPages)
	case c.DenseAfter < 0:
		return fmt.Errorf("invalid --dense-after %v: want a duration such as 5m, or 0 to turn the dense tier off", c.DenseAfter)
	case c.DenseCPU < 0.01 || c.DenseCPU > 1:
		return fmt.Errorf("invalid --dense-cpu %v: want a share of one CPU from 0.01 to 1", c.DenseCPU)
	case c.DenseLevel < 1 || c.DenseLevel > 19:
		return fmt.Errorf("invalid --dense-level %d: want a zstd level from 1 to 19", c.DenseLevel)
	case c.GPUDevice < 0:
		return fmt.Errorf("invalid --gpu-device %d: want a CUDA device index, 0 or more", c.GPUDevice)
	case c.GPUMinPages < 1 || c.GPUMinPages > c.BatchPages:
		return fmt.Errorf("invalid --gpu-min-pages %d: want 1 to --batch-pages (%d)", c.GPUMinPages, c.BatchPages)
	case c.Staging < 0 || (c.Staging > 0 && int64(c.Staging) < int64(c.BatchInFlight+1)*int64(c.BatchPages)*codec.PageSize):
		return fmt.Errorf("invalid --staging %s: want 0, or room for --batch-inflight+1 batches of --batch-pages (%s)",
			c.Staging.String(), formatSize(int64(c.BatchInFlight+1)*int64(c.BatchPages)*codec.PageSize))
	}
	return nil
}

// validateKernel checks the flags of the kernel device, swap on it and
// other clients' connections.
func validateKernel(c *serving.Config) error {
	switch {
	case c.SwapPriority < -1 || c.SwapPriority > 32767:
		return fmt.Errorf("invalid --swap-priority %d: want -1 (the kernel's default) to 32767", c.SwapPriority)
	case c.KernelConns < 1 || c.KernelConns > 16:
		return fmt.Errorf("invalid --kernel-connections %d: want 1 to 16", c.KernelConns)
	case c.UblkDepth < 1 || c.UblkDepth > serving.MaxUblkDepth:
		return fmt.Errorf("invalid --ublk-depth %d: want 1 to %d", c.UblkDepth, serving.MaxUblkDepth)
	case c.MaxConns < 0 || c.MaxConns > 65536:
		return fmt.Errorf("invalid --max-connections %d: want 1 to 65536, or 0 for no limit", c.MaxConns)
	case c.KernelTimeout < 0 || c.KernelTimeout%time.Second != 0:
		return fmt.Errorf("invalid --kernel-timeout %v: want whole seconds, e.g. 120s, or 0", c.KernelTimeout)
	case c.KernelDeadTimeout%time.Second != 0 || (c.KernelDeadTimeout < 0 && c.KernelDeadTimeout != -time.Second):
		return fmt.Errorf("invalid --kernel-dead-timeout %v: want whole seconds, e.g. 5m, or -1s for none", c.KernelDeadTimeout)
	}
	return validateTransport(c)
}

// validateTransport checks --transport against the flags it depends on.
func validateTransport(c *serving.Config) error {
	switch c.Transport {
	case serving.TransportNBD, serving.TransportAuto:
		return nil
	case serving.TransportUblk:
	default:
		return fmt.Errorf("invalid --transport %q: want nbd, ublk or auto", c.Transport)
	}
	switch {
	case c.Device == "" && !c.Swap:
		return errors.New("invalid --transport ublk without a kernel device: it serves the one gzramd creates; add --swap, or --device auto")
	case c.Device != "" && c.Device != "auto":
		return fmt.Errorf("invalid --device %s with --transport ublk: the driver numbers /dev/ublkbN itself; leave --device out, or give auto", c.Device)
	}
	return nil
}

// validateRuntime checks the Go runtime's limits.
func validateRuntime(c *serving.Config) error {
	switch {
	case c.GoMemoryLimit < 0:
		return fmt.Errorf("invalid --go-memory-limit %s: want a size such as 512MiB, or 0", c.GoMemoryLimit.String())
	case c.GoMemoryLimit > 0 && c.GoMemoryLimit < 32<<20:
		return fmt.Errorf("invalid --go-memory-limit %s: below 32MiB the daemon would do nothing but collect garbage", c.GoMemoryLimit.String())
	case c.GCPercent < -1 || c.GCPercent > 10000:
		return fmt.Errorf("invalid --gc-percent %d: want 1 to 10000, -1 (off) or 0 (leave the runtime's)", c.GCPercent)
	}
	return nil
}

// validateAddresses checks the flags that name something outside: the
// log level, the TCP and metrics addresses, TLS, the kernel device, the
// trace file.
func validateAddresses(c *serving.Config) error {
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if c.TCP != "" {
		if _, _, err := net.SplitHostPort(c.TCP); err != nil {
			return fmt.Errorf("invalid --tcp %q: want HOST:PORT, e.g. 127.0.0.1:10809", c.TCP)
		}
	}
	if err := validateTLS(c); err != nil {
		return err
	}
	if c.Metrics != "" {
		if _, _, err := net.SplitHostPort(c.Metrics); err != nil {
			return fmt.Errorf("invalid --metrics %q: want HOST:PORT, e.g. 127.0.0.1:9829", c.Metrics)
		}
	}
	if c.Device != "" {
		if _, err := serving.ParseDevice(c.Device); err != nil {
			return fmt.Errorf("invalid --device %q: %v", c.Device, err)
		}
	}
	if c.RecordTrace != "" {
		if err := checkCreatable(c.RecordTrace); err != nil {
			return fmt.Errorf("invalid --record-trace %q: %v", c.RecordTrace, err)
		}
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func runServe(ctx context.Context, cfg *serving.Config) error {
	if err := validate(cfg); err != nil {
		return usageErr(err)
	}
	if err := socketDir(cfg.Socket, defaultSocket()); err != nil {
		return err
	}
	level, _ := parseLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// The supervisor's serving process, and a process re-executed as an
	// IO flusher, resolve it again quietly: the process before said why.
	child := supervise.FromEnv().Serving
	transportLog := log
	if child || swapsafe.ReExecuted() {
		transportLog = slog.New(slog.DiscardHandler)
	}
	if err := resolveTransport(cfg, serving.ProbeUblk, transportLog); err != nil {
		return err
	}
	if cfg.Supervise && !child {
		return runSupervisor(ctx, cfg, log)
	}
	return serving.Run(ctx, cfg, buildVersion(), level)
}

// machinePlan sizes what the daemon holds ahead of need for this machine
// (swapsafe.Plan): its RAM, its CPUs, and the largest request the kernel
// device is allowed (serving.MaxKernelRequest).
func machinePlan() swapsafe.Plan {
	var ram int64
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		ram = int64(si.Totalram) * int64(si.Unit)
	}
	return swapsafe.PlanFor(ram, runtime.GOMAXPROCS(0), serving.MaxKernelRequest)
}

// resolveTransport makes --transport nbd or ublk (probe tells whether ublk
// is usable here: serving.ProbeUblk) and logs the choice where it was not
// named outright, and the limits of ublk where it is chosen.
func resolveTransport(cfg *serving.Config, probe func() error, log *slog.Logger) error {
	asked := cfg.Transport
	transport, why, err := cfg.ResolveTransport(probe)
	if err != nil {
		return err
	}
	cfg.Transport = transport
	switch {
	case transport == serving.TransportUblk:
		log.Info("transport: ublk", "asked", asked,
			"note", "not the default yet: its takeover (ublk user recovery) is new")
	case asked == serving.TransportAuto:
		log.Info("transport: nbd", "asked", asked, "why", why)
	}
	return nil
}
