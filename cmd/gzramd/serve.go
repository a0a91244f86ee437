package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gzramd/gzramd/pkg/batch"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

type serveConfig struct {
	size          sizeValue
	memLimit      sizeValue
	socket        string
	tcp           string
	export        string
	metrics       string
	backend       string
	algorithm     string
	batchPages    int
	batchDeadline time.Duration
	batchInFlight int
	hugeThreshold int
	logLevel      string
}

func defaultSocket() string {
	if dir := os.Getenv("RUNTIME_DIRECTORY"); dir != "" {
		// systemd may list several directories, colon-separated.
		return filepath.Join(strings.Split(dir, ":")[0], "gzramd.sock")
	}
	return "/run/gzramd/gzramd.sock"
}

func newServeCmd() *cobra.Command {
	cfg := serveConfig{size: 1 << 30}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon in the foreground",
		Long: `Run the daemon in the foreground: create the compressed device and serve it
over NBD on a Unix socket (and TCP, if asked) until SIGINT or SIGTERM.

Every flag can also be set from the environment as GZRAMD_<FLAG>, upper case
with dashes as underscores (GZRAMD_SIZE=8GiB, GZRAMD_MEM_LIMIT=2GiB); a flag on
the command line wins.

Connect the kernel by hand with
  nbd-client -unix /run/gzramd/gzramd.sock /dev/nbd0 -N gzram0 -b 4096 -swap`,
		Example: `  gzramd serve --size 8GiB --mem-limit 4GiB
  gzramd serve --socket /tmp/gz.sock --tcp 127.0.0.1:10809 --backend cpu`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return err
			}
			return runServe(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.Var(&cfg.size, "size", "device size (e.g. 8GiB); a multiple of 4KiB")
	f.Var(&cfg.memLimit, "mem-limit", "most memory the compressed pages may use (e.g. 2GiB); 0 means no limit; writes past it fail with ENOSPC")
	f.StringVar(&cfg.socket, "socket", defaultSocket(), "Unix socket to serve NBD on (mode 0600); empty to disable")
	f.StringVar(&cfg.tcp, "tcp", "", "TCP address to serve NBD on, e.g. 127.0.0.1:10809 (a bare :PORT means loopback); off by default")
	f.StringVar(&cfg.export, "export", "gzram0", "export name; the empty name reaches it too")
	f.StringVar(&cfg.metrics, "metrics", "127.0.0.1:9829", "address for the Prometheus /metrics endpoint; empty to disable")
	f.StringVar(&cfg.backend, "backend", "auto", "compression backend: auto (GPU when present, else CPU), gpu or cpu")
	f.StringVar(&cfg.algorithm, "algorithm", "lz4", "compression algorithm: lz4 or zstd (zstd runs on the CPU only)")
	f.IntVar(&cfg.batchPages, "batch-pages", 256, "largest batch of pages sent to the compressor at once")
	f.DurationVar(&cfg.batchDeadline, "batch-deadline", 500*time.Microsecond, "longest a page waits for its batch to fill before going to the CPU")
	f.IntVar(&cfg.batchInFlight, "batch-inflight", 4, "batches compressing at once; writers wait when all are busy")
	f.IntVar(&cfg.hugeThreshold, "huge-threshold", device.DefaultHugeThreshold, "pages that compress to this many bytes or more are stored raw (1-4096)")
	f.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// validate checks every flag before anything starts, so that a bad value
// stops the daemon with one line naming the flag.
func (c *serveConfig) validate() error {
	switch {
	case c.size <= 0 || c.size%codec.PageSize != 0:
		return fmt.Errorf("invalid --size %s: want a positive multiple of 4KiB, e.g. 1GiB", c.size.String())
	case int64(c.size) > device.MaxSize:
		return fmt.Errorf("invalid --size %s: the largest device is %s", c.size.String(), formatSize(device.MaxSize))
	case c.memLimit < 0:
		return fmt.Errorf("invalid --mem-limit %s: want a size such as 2GiB, or 0 for no limit", c.memLimit.String())
	case c.socket == "" && c.tcp == "":
		return errors.New("nothing to serve on: give --socket PATH or --tcp ADDR")
	case c.backend != "auto" && c.backend != "gpu" && c.backend != "cpu":
		return fmt.Errorf("invalid --backend %q: want auto, gpu or cpu", c.backend)
	case c.algorithm != "lz4" && c.algorithm != "zstd":
		return fmt.Errorf("invalid --algorithm %q: want lz4 or zstd", c.algorithm)
	case c.algorithm == "zstd" && c.backend == "gpu":
		return errors.New("invalid --backend gpu with --algorithm zstd: the GPU compresses LZ4 only")
	case c.batchPages < 1 || c.batchPages > 65536:
		return fmt.Errorf("invalid --batch-pages %d: want 1 to 65536", c.batchPages)
	case c.batchDeadline <= 0 || c.batchDeadline > time.Second:
		return fmt.Errorf("invalid --batch-deadline %v: want a duration from 1µs to 1s, e.g. 500us", c.batchDeadline)
	case c.batchInFlight < 1 || c.batchInFlight > 1024:
		return fmt.Errorf("invalid --batch-inflight %d: want 1 to 1024", c.batchInFlight)
	case c.hugeThreshold < 1 || c.hugeThreshold > codec.PageSize:
		return fmt.Errorf("invalid --huge-threshold %d: want 1 to 4096", c.hugeThreshold)
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return err
	}
	if c.tcp != "" {
		if _, _, err := net.SplitHostPort(c.tcp); err != nil {
			return fmt.Errorf("invalid --tcp %q: want HOST:PORT, e.g. 127.0.0.1:10809", c.tcp)
		}
	}
	if c.metrics != "" {
		if _, _, err := net.SplitHostPort(c.metrics); err != nil {
			return fmt.Errorf("invalid --metrics %q: want HOST:PORT, e.g. 127.0.0.1:9829", c.metrics)
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

// tcpAddr binds a bare :PORT to loopback: exposing swap over the network
// is something the operator must ask for by naming the address.
func tcpAddr(s string) string {
	if strings.HasPrefix(s, ":") {
		return "127.0.0.1" + s
	}
	return s
}

func runServe(ctx context.Context, cfg serveConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	level, _ := parseLevel(cfg.logLevel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cpuCodec, err := codec.New(cfg.algorithm)
	if err != nil {
		return err
	}
	cpu := codec.NewCPUBatch(cpuCodec, 0)
	primary := codec.BatchCompressor(cpu)
	switch cfg.backend {
	case "gpu":
		return errors.New("invalid --backend gpu: this build has no GPU backend yet; use --backend cpu or auto")
	case "auto":
		log.Info("no GPU backend in this build; compressing on the CPU", "algorithm", cfg.algorithm)
	}

	store, err := pagestore.New(pagestore.Config{MemLimit: int64(cfg.memLimit)})
	if err != nil {
		return fmt.Errorf("creating the page store: %w", err)
	}
	defer store.Close()
	batcher, err := batch.New(primary, cpu, batch.Config{
		MaxPages: cfg.batchPages, InFlight: cfg.batchInFlight, Deadline: cfg.batchDeadline,
	}, nil)
	if err != nil {
		return err
	}
	dev, err := device.New(device.Config{
		Size: int64(cfg.size), Codec: cpuCodec, Batcher: batcher, Store: store,
		HugeThreshold: cfg.hugeThreshold, Logger: log,
		CorruptReads: os.Getenv("GZRAMD_FAULT_CORRUPT_READS") == "1",
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	defer batcher.Close() // runs before dev.Close: no page is mid-commit when the table goes

	srv, err := nbd.NewServer([]nbd.Export{{Name: cfg.export, Description: "gzramd compressed RAM device", Backend: dev}},
		nbd.Options{Logger: log})
	if err != nil {
		return err
	}

	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	if cfg.socket != "" {
		l, err := listenUnix(cfg.socket)
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
	}
	if cfg.tcp != "" {
		addr := tcpAddr(cfg.tcp)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on --tcp %s: %w", addr, err)
		}
		if ip := net.ParseIP(l.Addr().(*net.TCPAddr).IP.String()); ip == nil || !ip.IsLoopback() {
			log.Warn("serving NBD beyond loopback: anyone who can reach this address can read and write the device", "addr", l.Addr())
		}
		listeners = append(listeners, l)
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, nbd.ErrServerClosed) {
				errc <- fmt.Errorf("serving on %s: %w", l.Addr(), err)
			}
		}()
		log.Info("serving NBD", "addr", l.Addr().String(), "network", l.Addr().Network(), "export", cfg.export)
	}
	log.Info("gzramd ready", "version", version, "size", cfg.size.String(), "algorithm", cfg.algorithm,
		"backend", primary.Name(), "mem_limit", cfg.memLimit.String())

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: waiting for requests in flight")
	case serveErr = <-errc:
		log.Error("stopping", "err", serveErr)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("shutdown did not finish cleanly", "err", err)
	}
	st := dev.Stats()
	log.Info("stopped", "stored_pages", st.StoredPages, "orig_data_bytes", st.OrigDataSize, "compr_data_bytes", st.ComprDataSize)
	return serveErr
}

// listenUnix listens on path with mode 0600, replacing a stale socket left
// by a daemon that died, but never a live one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory for --socket %s: %w", path, err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("--socket %s: another daemon is already serving there", path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket %s exists and is not a socket", path)
		}
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on --socket %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}
