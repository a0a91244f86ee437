// Package pipeline builds gzramd's data path — page store, router, device
// and, with an accelerator, the write-behind staging area — from one
// Config, and takes it down in the right order. The daemon, `gzramd bench`
// and the tests all build it here, so the rules that tie the parts
// together live in one place.
package pipeline

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/stage"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// Defaults of the Config fields that have them.
const (
	// DefaultStagingBytes is held, pinned, from the start. On an H100 the
	// recorded swap trace (bench/trace.sh, LZ4, 1 and 4 jobs) moved 1.02x
	// the bytes with 16 MiB that it moved with 64 MiB, at 1.00x and 0.97x
	// the CPU per GB (bench/results/footprint-h100-2026-11-26.md).
	DefaultStagingBytes = 16 << 20
	// DefaultStagingWaitZstd bounds how long a zstd write waits for a
	// staging buffer before it compresses on the CPU. Measured on an H100
	// (gzramd bench, 32 writers overloading the GPU): no wait 2.45-2.50
	// GB/s at 5.4-5.5 CPU-s/GB, 5 ms 2.65-2.73 at 1.5-1.9, 20 ms
	// 2.45-2.49 at 0.77-0.85.
	DefaultStagingWaitZstd = 20 * time.Millisecond
	DefaultBatchPages      = 256
	DefaultBatchDeadline   = time.Millisecond
	DefaultBatchWorkers    = 8
)

// Config describes a data path. Zero values take the defaults.
type Config struct {
	Size      int64  // device bytes, a multiple of 4 KiB
	Algorithm string // "lz4" (default) or "zstd"

	// The store: MemLimit 0 means none; Prefault and ArenaSize as in
	// pagestore.Config.
	MemLimit  int64
	Prefault  int64
	ArenaSize int
	// HugeThreshold is the compressed length from which pages are stored
	// raw (0: device.DefaultHugeThreshold).
	HugeThreshold int
	// ObjectPages keeps the pages a write compresses inline together, as
	// objects of up to that many (device.Config.ObjectPages).
	ObjectPages int
	// Dense is the dense tier (device.Config.Dense; its After 0 turns
	// it off). Device.RunDense runs it.
	Dense device.DenseConfig

	// Accelerator, if not nil, compresses the staged writes; the caller
	// opened it and closes it after Close. Without one every write
	// compresses inline on the CPU and nothing is staged.
	Accelerator route.Accelerator
	// MinAcceleratorPages: smaller staged batches go to the CPU
	// (0: route.DefaultMinAcceleratorPages).
	MinAcceleratorPages int
	// StagingBytes is the write-behind memory with an accelerator, in
	// whole batches, at least BatchWorkers+1 of them (DefaultStagingBytes
	// is the daemon's default). 0 stages nothing: every write compresses
	// inline on the CPU, and the accelerator is not used.
	StagingBytes int64
	// StagingWait is how long a write that finds staging full waits for a
	// buffer before it compresses on the CPU: 0 for the algorithm's
	// default (DefaultStagingWaitZstd with zstd, no wait with LZ4),
	// negative for none.
	StagingWait time.Duration
	// BatchPages is the pages of one staged batch (0: DefaultBatchPages),
	// at most what the accelerator takes at once.
	BatchPages int
	// BatchDeadline is the longest a staged page waits for its batch to
	// fill (0: DefaultBatchDeadline).
	BatchDeadline time.Duration
	// BatchWorkers is the staged batches compressed at once
	// (0: DefaultBatchWorkers).
	BatchWorkers int

	// State, when set, holds the data path's memory (see Open); without
	// one, it is the process's own and goes with it.
	State *State

	Observer route.Observer
	Logger   *slog.Logger
}

// Pipeline is a running data path.
type Pipeline struct {
	Store  *pagestore.Store
	Router *route.Router
	Device *device.Device
	Codec  codec.Codec

	prefault int64
}

// New builds a fresh data path: every page reads as zeroes. With
// cfg.State, it lives in the state's files, which must hold none (Open
// takes one over).
func New(cfg Config) (*Pipeline, error) {
	p, _, err := build(cfg, false)
	return p, err
}

// Open builds the data path in cfg.State: a fresh one when the state holds
// none, else the one it holds, taken over from the process that died
// serving it (see device.Recover); rec then says what was found.
func Open(cfg Config) (p *Pipeline, rec *device.Recovered, err error) {
	if cfg.State == nil {
		return nil, nil, errors.New("pipeline: Open needs Config.State")
	}
	info, err := cfg.State.Info()
	if err != nil {
		return nil, nil, err
	}
	if !info.Sealed {
		// Never finished: nothing in it was acknowledged.
		if err := cfg.State.reset(); err != nil {
			return nil, nil, err
		}
		p, _, err := build(cfg, false)
		return p, nil, err
	}
	return build(cfg, true)
}

// build builds the data path, taking over the one in cfg.State when
// recover is set.
func build(cfg Config, recover bool) (_ *Pipeline, _ *device.Recovered, err error) {
	if cfg.Algorithm == "" {
		cfg.Algorithm = "lz4"
	}
	if cfg.HugeThreshold == 0 {
		cfg.HugeThreshold = device.DefaultHugeThreshold
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	staging, err := stagingConfig(&cfg)
	if err != nil {
		return nil, nil, err
	}
	p := &Pipeline{prefault: cfg.Prefault}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.Codec, err = codec.New(cfg.Algorithm); err != nil {
		return nil, nil, err
	}
	rc := route.Config{
		Codec: p.Codec, MinAcceleratorPages: cfg.MinAcceleratorPages,
		Observer: cfg.Observer, Logger: cfg.Logger,
	}
	if staging.Batches > 0 {
		rc.Accelerator = cfg.Accelerator
		// An output set for each batch a worker compresses, and one for
		// the CPU should every batch on the accelerator hang.
		rc.BatchPages, rc.Workers = staging.BatchPages, staging.Workers
		rc.Window = staging.Deadline
	}
	if p.Router, err = route.New(rc); err != nil {
		return nil, nil, fmt.Errorf("pipeline: %w", err)
	}
	sc := pagestore.Config{MemLimit: cfg.MemLimit, Prefault: cfg.Prefault, ArenaSize: cfg.ArenaSize}
	dc := device.Config{
		Size: cfg.Size, Codec: p.Codec, Router: p.Router, Staging: staging,
		HugeThreshold: cfg.HugeThreshold, ObjectPages: cfg.ObjectPages, Dense: cfg.Dense, Logger: cfg.Logger,
	}
	if cfg.State != nil {
		sc.Files, dc.Files = &cfg.State.Store, &cfg.State.Device
	}
	if recover {
		rec, err := p.recover(&cfg, sc, dc)
		return p, rec, err
	}
	if p.Store, err = pagestore.New(sc); err != nil {
		return nil, nil, fmt.Errorf("pipeline: the page store: %w", err)
	}
	dc.Store = p.Store
	if p.Device, err = device.New(dc); err != nil {
		return nil, nil, fmt.Errorf("pipeline: %w", err)
	}
	if cfg.State != nil {
		if err := cfg.State.seal(&cfg, cfg.ArenaSize); err != nil {
			return nil, nil, err
		}
	}
	return p, nil, nil
}

// recover takes over the data path in cfg.State.
func (p *Pipeline) recover(cfg *Config, sc pagestore.Config, dc device.Config) (*device.Recovered, error) {
	h, unmap, err := cfg.State.mapHeader()
	if err != nil {
		return nil, err
	}
	defer unmap()
	if err := h.check(cfg); err != nil {
		return nil, err
	}
	sc.ArenaSize = int(h.arenaSize) // the store's layout is the state's
	rs, err := pagestore.Recover(sc)
	if err != nil {
		return nil, fmt.Errorf("pipeline: taking the page store over: %w", err)
	}
	dev, store, rec, err := device.Recover(dc, rs)
	if err != nil {
		rs.Close()
		return nil, fmt.Errorf("pipeline: taking the device over: %w", err)
	}
	p.Device, p.Store = dev, store
	h.takeovers++
	return &rec, nil
}

// Holdings lists what the data path holds from the start so that storing a
// swapped-out page allocates and faults nothing (see docs/DESIGN.md).
func (p *Pipeline) Holdings() []swapsafe.Holding {
	held := p.Device.Held()
	hs := []swapsafe.Holding{
		{Name: "page-table", Bytes: held.Table, Why: "8 bytes per page of the device, faulted in by gzramd-table as far as writes reach and 128 MiB of device beyond: a swap-out to a page never used must not fault in the table"},
		{Name: "store-prefault", Bytes: p.prefault, Why: "store memory faulted in ahead of use by gzramd-prefault (after 5 s without a write, what the write rate asks for: an eighth to half of it), and emptied slabs kept for reuse (--prefault)"},
		{Name: "write-scratch", Bytes: held.Scratch, Why: "outputs of writes compressed inline and buffers of partial pages, written at start; a write waits for one rather than allocating"},
		{Name: "codec-contexts", Bytes: p.Codec.HeldBytes(), Why: "the " + p.Codec.Name() + " codec's compression and decompression contexts (with zstd and --object-pages, those of objects of several pages too), written at start; a page's compression or decoding waits for a free one rather than allocating"},
	}
	if held.Dense > 0 {
		hs = append(hs, swapsafe.Holding{Name: "dense-tier", Bytes: held.Dense, Why: "the dense tier's recompressor: its zstd context for objects of 16 pages and its buffers, the groups' idle ages, the decoder of its objects where the codec is not zstd, and with a GPU its batch of groups, pinned (--dense-after)"})
	}
	if held.Staging > 0 {
		hs = append(hs,
			swapsafe.Holding{Name: "staging", Bytes: held.Staging, Why: "write-behind pages, pinned and written at start (--staging)"},
			swapsafe.Holding{Name: "gpu-outputs", Bytes: p.Router.HeldBytes(), Why: "outputs of the staged batches being compressed and the GPU's shadow outputs, pinned"})
	}
	return hs
}

// stagingConfig derives the staging area from cfg: none without an
// accelerator.
func stagingConfig(cfg *Config) (stage.Config, error) {
	if cfg.Accelerator == nil || cfg.StagingBytes == 0 {
		return stage.Config{}, nil
	}
	sc := stage.Config{
		BatchPages: cfg.BatchPages, Deadline: cfg.BatchDeadline, Workers: cfg.BatchWorkers,
	}
	if sc.BatchPages == 0 {
		sc.BatchPages = DefaultBatchPages
	}
	if sc.Deadline == 0 {
		sc.Deadline = DefaultBatchDeadline
	}
	if sc.Workers == 0 {
		sc.Workers = DefaultBatchWorkers
	}
	// A write that finds staging full waits for a buffer rather than
	// compress on the CPU where that costs far more than the accelerator:
	// zstd, about 30 times the CPU per GB (LZ4 about 10, and it waits
	// for nobody).
	switch {
	case cfg.StagingWait > 0:
		sc.Wait = cfg.StagingWait
	case cfg.StagingWait == 0 && cfg.Algorithm == "zstd":
		sc.Wait = DefaultStagingWaitZstd
	}
	bytes := cfg.StagingBytes
	sc.Batches = int(bytes / int64(sc.BatchPages*codec.PageSize))
	if sc.Batches < sc.Workers+1 {
		return sc, fmt.Errorf("pipeline: %d bytes of staging hold %d batches of %d pages; %d workers need at least %d",
			bytes, sc.Batches, sc.BatchPages, sc.Workers, sc.Workers+1)
	}
	sc.Batches = min(sc.Batches, stage.MaxBatches)
	return sc, nil
}

// Close compresses and commits what is staged, then frees the device and
// the store. The accelerator is the caller's to close afterwards.
func (p *Pipeline) Close() error {
	var errs []error
	if p.Device != nil {
		errs = append(errs, p.Device.Close())
	}
	if p.Store != nil {
		errs = append(errs, p.Store.Close())
	}
	return errors.Join(errs...)
}
