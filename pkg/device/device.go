// Package device is gzramd's block device: a table of 4 KiB pages, each
// empty, same-filled, compressed, stored raw or staged, behind the
// blockdev.Backend interface.
//
// Same-filled pages never reach a codec. Other whole pages take one of two
// paths, chosen by the router (pkg/route): with an accelerator they are
// staged (staged.go, receive.go): copied into the staging area, their
// entries pointing there, and acknowledged; a staging worker compresses
// them in batches and commits each result with a compare-and-swap on the
// page's entry, so a newer write always wins. Without one, or when staging
// is full, a write compresses its own pages inline on the CPU (inline.go),
// and may keep them together as objects of several pages (object.go).
// Partial writes, trims and write-zeroes read, modify and write their page
// under the page's lock.
//
// The page table (table.go) owns the entries (and says what one holds),
// mapped from their file, the stripe locks over them, their counts by
// state, and replacing an entry. Device keeps the table, the files
// (files.go), reads and writes (device.go, write.go). Its other jobs are
// types of their own, given what they use, never the device: objects owns
// the format of the objects pages are stored in (object.go) and the cache
// of the dense tier's decoded frames (framecache.go), stager the
// write-behind, inliner the writes compressed in the writer's goroutine,
// compactor compaction (compact.go), recovery the takeover of a table a
// dead process left (recover.go), and denseSide the device as the dense
// tier (pkg/dense) sees it (dense.go). Those that change entries are given
// the table and take its locks themselves, in the order their commits
// need; where one needs an operation of the device's (writing a page,
// reading one under its lock) it is given that function alone.
package device

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gzramd/gzramd/internal/freelist"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/stage"
)

const pageSize = codec.PageSize

// DefaultHugeThreshold matches zram's huge_class_size for 4 KiB pages: a
// page whose compressed form is at least this long is stored raw, which
// costs little more memory and nothing to decode.
const DefaultHugeThreshold = 3264

// Config describes a device.
type Config struct {
	Size int64 // bytes, a multiple of 4096
	// Files, when set, hold the page table and the staging area (empty
	// for New, a device's for Recover); the device leaves them open at
	// Close. When nil, the device makes its own.
	Files *Files
	// Codec decodes every stored page and compresses partial writes.
	Codec  codec.Codec
	Router *route.Router
	Store  *pagestore.Store
	// Staging, when its Batches is not 0, is the write-behind area for
	// the router's accelerator (Limit is set from HugeThreshold).
	Staging       stage.Config
	HugeThreshold int // 0: DefaultHugeThreshold
	// ObjectPages, from 2 to 16 and a power of two, has the pages of a
	// write compressed inline kept together, as objects of up to that
	// many pages (object.go); 0 or 1 keeps every page on its own. It
	// needs the LZ4 codec.
	ObjectPages int
	// Dense, when its After is set, recompresses groups of pages left
	// idle into zstd objects (pkg/dense; RunDense runs it).
	Dense  DenseConfig
	Logger *slog.Logger
}

// pageBuffers is how many page buffers partial-page requests share (one
// or two each) before they allocate.
const pageBuffers = 64

// Device is safe for concurrent use.
type Device struct {
	cfg Config
	log *slog.Logger
	// pageTable is the entries, their locks and their counts (table.go);
	// mapping the files, and the staging area mapped from its file.
	pageTable
	mapping
	stager *stager // nil without an accelerator
	bufs   *freelist.List[*[pageSize]byte]
	obj    objects     // the objects pages are stored in, and their format
	dense  *dense.Tier // nil without the dense tier
	// denseSide is the device as the dense tier sees it, and the
	// scratch of its commits (dense.go); nil without the tier.
	denseSide *denseSide
	inline    inliner // writes compressed in their own goroutine, and their scratch

	failedReads, failedWrites, invalidIO, notifyFree atomic.Uint64
}

// MaxSize is the largest device: the store tags objects with 32-bit page
// indexes up to pagestore.MaxOwner.
const MaxSize = int64(pagestore.MaxOwner+1) * pageSize

// New creates an empty device: every page reads as zeroes. cfg.Files, if
// set, must be empty.
func New(cfg Config) (*Device, error) {
	d, err := open(cfg, true)
	if err != nil {
		return nil, err
	}
	if d.stager, err = newStager(d.cfg, &d.pageTable, &d.obj, d.staging, d.writeFilled); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// open checks cfg and maps the device's files; fresh says they must be
// empty. Staging is not started.
func open(cfg Config, fresh bool) (_ *Device, err error) {
	switch {
	case cfg.Size <= 0 || cfg.Size%pageSize != 0:
		return nil, fmt.Errorf("device: size %d is not a positive multiple of %d", cfg.Size, pageSize)
	case cfg.Size > MaxSize:
		return nil, fmt.Errorf("device: size %d above the maximum %d", cfg.Size, MaxSize)
	case cfg.Codec == nil || cfg.Router == nil:
		return nil, errors.New("device: codec and router are required")
	case fresh && cfg.Store == nil:
		return nil, errors.New("device: a store is required")
	}
	if cfg.HugeThreshold == 0 {
		cfg.HugeThreshold = DefaultHugeThreshold
	}
	if cfg.HugeThreshold < 1 || cfg.HugeThreshold > pageSize {
		return nil, fmt.Errorf("device: huge threshold %d out of range [1, %d]", cfg.HugeThreshold, pageSize)
	}
	if n := cfg.ObjectPages; n > 1 && (n > maxObjectPages || n&(n-1) != 0) {
		return nil, fmt.Errorf("device: objects of %d pages: want a power of two up to %d", n, maxObjectPages)
	} else if name := cfg.Codec.Name(); n > 1 && name != "lz4" && name != "zstd" {
		return nil, fmt.Errorf("device: objects of several pages need the lz4 or zstd codec, not %s", name)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Device{
		cfg:       cfg,
		log:       cfg.Logger,
		pageTable: newPageTable(uint32(cfg.Size / pageSize)),
	}
	defer func() {
		if err != nil {
			d.unmap()
		}
	}()
	if err := d.mapFiles(cfg, &d.pageTable, fresh); err != nil {
		return nil, err
	}
	// Kept across collections (see freelist): partial-page requests take
	// one or two each.
	d.bufs = freelist.New(pageBuffers, func() *[pageSize]byte {
		b := new([pageSize]byte)
		clear(b[:]) // written now, not first while serving
		return b
	})
	d.bufs.Fill()
	d.inline = newInliner(cfg, &d.pageTable, &d.obj)
	if err := d.obj.init(cfg); err != nil {
		return nil, err
	}
	if cfg.Dense.After != 0 {
		d.denseSide = newDenseSide(&d.pageTable, &d.obj, d.load)
		if d.dense, err = dense.New(cfg.Dense, d.pages, cfg.Codec.Name(), d.denseSide, d.log); err != nil {
			return nil, err
		}
		if err := d.obj.holdZstd(); err != nil {
			return nil, err
		}
	}
	if cfg.ObjectPages > 1 || d.dense != nil {
		d.holdObjects()
	}
	return d, nil
}

// holdObjects readies the device for objects of several pages: their
// groups share a lock, and reads get the scratch they decode in.
func (d *Device) holdObjects() {
	d.holdGroups()
	d.obj.holdScratch(d.cfg.ObjectPages > 1)
}

// Close compresses and commits what is staged and unmaps the device's
// memory. The files, if the caller gave them, keep the table and the
// store's allocations, for Recover; the device's own go with it. The device
// must not be used afterwards.
func (d *Device) Close() error {
	if d.stager != nil {
		d.stager.close()
	}
	return d.unmap()
}

// unmap undoes open's mappings: the staging area, then the table's
// entries, then the files if the device made them.
func (d *Device) unmap() error { return d.mapping.unmap(&d.pageTable) }

// Held is the memory a device holds from the start, in bytes.
type Held struct {
	Table   int64 // the page table, faulted in
	Scratch int64 // buffers of inline writes and partial pages, written
	Staging int64 // staging memory, written (0 without staging)
	// Dense is the dense tier's: its buffers, its zstd context, the
	// groups' idle ages, and the decoder of its objects where the
	// codec is not zstd.
	Dense int64
}

// Held returns what the device holds ahead of need.
func (d *Device) Held() Held {
	h := Held{
		Table:   d.backing.bytes(),
		Scratch: d.inline.held() + pageBuffers*pageSize,
	}
	objScratch, zstd := d.obj.held()
	h.Scratch += objScratch
	if d.stager != nil {
		sc := d.stager.area.Config()
		h.Staging = int64(sc.Batches) * int64(sc.BatchPages) * pageSize
	}
	if d.dense != nil {
		h.Dense = d.dense.HeldBytes() + d.denseSide.held()
	}
	h.Dense += zstd
	return h
}

// Size implements blockdev.Backend.
func (d *Device) Size() int64 { return d.cfg.Size }

func (d *Device) check(off, length int64) error {
	if off < 0 || length < 0 || off > d.cfg.Size || length > d.cfg.Size-off {
		d.invalidIO.Add(1)
		return fmt.Errorf("device: range [%d, +%d) outside the device: %w", off, length, syscall.EINVAL)
	}
	return nil
}

// forPages splits [off, off+length) into per-page pieces.
func forPages(off, length int64, fn func(idx uint32, in, n int) error) error {
	for length > 0 {
		idx := uint32(off / pageSize)
		in := int(off % pageSize)
		n := int(min(int64(pageSize-in), length))
		if err := fn(idx, in, n); err != nil {
			return err
		}
		off += int64(n)
		length -= int64(n)
	}
	return nil
}

// ReadAt implements blockdev.Backend. The pages of one group are read under
// one hold of its lock, so that an object of several pages is decoded once
// for all the pages the read wants of it.
func (d *Device) ReadAt(_ context.Context, p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	d.dense.Touch(off, int64(len(p)))
	// The scratch objects of several pages are decoded in is taken when
	// the read meets one: reads of pages alone, most of them, never
	// meet the other readers at its channel.
	var sc *objectScratch
	defer func() { d.obj.putScratch(sc) }()
	held := stripeHold{read: true}
	last := uint32((off + int64(len(p)) - 1) / pageSize)
	readPages := int(last-uint32(off/pageSize)) + 1
	err := forPages(off, int64(len(p)), func(idx uint32, in, n int) error {
		dst := p[:n]
		p = p[n:]
		if held.lock(d.stripe(idx)) && sc != nil {
			sc.decoded = 0 // another group: what was decoded may be gone
		}
		page := dst
		if n < pageSize {
			buf := d.bufs.Get()
			defer d.bufs.Put(buf)
			page = buf[:]
		}
		err := d.load(idx, page, sc, int(last-idx))
		if err == errNeedScratch {
			// Taken without the lock, which a writer holding a
			// scratch may be waiting for; then the page is read
			// again, as it is now.
			s := held.s
			held.release()
			sc = d.obj.scratch()
			sc.readPages = readPages
			held.lock(s)
			err = d.load(idx, page, sc, int(last-idx))
		}
		if err != nil {
			return err
		}
		if n < pageSize {
			copy(dst, page[in:])
		}
		return nil
	})
	held.release()
	if err != nil {
		d.failedReads.Add(1)
	}
	return err
}

// errNeedScratch is load's answer for a page of an object of several
// pages when the caller passed no scratch: it takes one and asks again.
var errNeedScratch = errors.New("device: an object scratch is needed")

// load decodes page idx into dst; the caller holds the page's stripe lock,
// and passes the scratch it took (objects.scratch) for objects of several
// pages, and how many pages after this one it will read.
func (d *Device) load(idx uint32, dst []byte, sc *objectScratch, ahead int) error {
	e := d.at(idx)
	switch e.state() {
	case stateEmpty:
		clear(dst)
	case stateSame:
		clear(dst)
	case stateFill:
		fill(dst, binary.NativeEndian.Uint64(d.cfg.Store.Bytes(e.handle(), fillLength)))
	case stateLost:
		return fmt.Errorf("device: page %d was lost when the device was taken over: %w", idx, syscall.EIO)
	case stateStored:
		if err := d.cfg.Codec.Decompress(dst, d.cfg.Store.Bytes(e.handle(), e.length())); err != nil {
			d.log.Error("stored page does not decode", "page", idx, "length", e.length(), "err", err)
			return fmt.Errorf("device: page %d: %w: %w", idx, err, syscall.EIO)
		}
	case stateHuge:
		copy(dst, d.cfg.Store.Bytes(e.handle(), pageSize))
	case statePart:
		switch {
		case sc == nil && d.obj.scratches != nil:
			return errNeedScratch
		case sc == nil:
			return fmt.Errorf("device: page %d is part of an object of several pages, and the device has no scratch to read it: %w", idx, syscall.EIO)
		}
		pages, err := d.obj.decode(idx, e, sc, min(e.partPages(), e.partIndex()+1+ahead))
		if err != nil {
			d.log.Error("stored object does not decode", "page", idx, "err", err)
			return fmt.Errorf("%w: %w", err, syscall.EIO)
		}
		copy(dst, pages[e.partIndex()*pageSize:])
	case stateStaged:
		// Its batch cannot be flushed while this lock is held: the
		// commit that replaces this entry needs it.
		copy(dst, d.staging[e.stagingPage()*pageSize:][:pageSize])
	}
	return nil
}

// fillEntry returns the entry for page idx filled with w: for a word other
// than zero, an object holding it, which the caller commits or frees.
func (d *Device) fillEntry(idx uint32, w uint64) (entry, error) {
	if w == 0 {
		return zeroEntry, nil
	}
	h, b, err := d.cfg.Store.Alloc(fillLength, idx)
	if err != nil {
		return 0, fmt.Errorf("device: storing the fill word of page %d: %w", idx, err)
	}
	binary.NativeEndian.PutUint64(b, w)
	return handleEntry(stateFill, h, fillLength), nil
}

// discard sets every whole page of the range to e (empty or zero-filled)
// and zeroes the partial pages at its ends.
func (d *Device) discard(off, length int64, e entry) error {
	d.dense.Touch(off, length)
	return forPages(off, length, func(idx uint32, in, n int) error {
		if n < pageSize {
			return d.modify(idx, func(page []byte) { clear(page[in : in+n]) })
		}
		s := d.stripe(idx)
		s.mu.Lock()
		if d.at(idx) == e {
			// Already so: leave the table's page untouched, so discarding
			// a never-written device does not fault its table in.
			s.mu.Unlock()
			return nil
		}
		ref := d.swapLocked(s, idx, e)
		s.mu.Unlock()
		d.obj.free(ref)
		return nil
	})
}

// Trim implements blockdev.Backend: whole pages are freed, like zram's discard.
func (d *Device) Trim(_ context.Context, off, length int64) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	d.notifyFree.Add(uint64(length / pageSize))
	return d.discard(off, length, entry(stateEmpty))
}

// WriteZeroes implements blockdev.Backend. Zero pages cost no memory either
// way; with noHole they are kept as same-filled pages rather than freed.
func (d *Device) WriteZeroes(_ context.Context, off, length int64, noHole bool) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	e := entry(stateEmpty)
	if noHole {
		e = zeroEntry
	}
	if err := d.discard(off, length, e); err != nil {
		d.failedWrites.Add(1)
		return err
	}
	return nil
}

// Flush implements blockdev.Backend: every acknowledged write is already held.
func (d *Device) Flush(context.Context) error { return nil }

// Compact moves objects out of sparse slabs so whole slabs go back to the
// OS, and returns how many it moved.
func (d *Device) Compact() int { return d.compactor().compact() }

// Stats are zram's statistics for the device (see zram.rst) plus error
// counters and the staging area's. Staged pages count as held raw: 4 KiB
// each in OrigDataSize, ComprDataSize and MemUsedTotal.
type Stats struct {
	OrigDataSize   int64 // bytes of pages held as objects or staged (same-filled pages excluded)
	ComprDataSize  int64
	MemUsedTotal   int64
	MemLimit       int64
	MemUsedMax     int64
	SamePages      int64
	PagesCompacted int64
	HugePages      int64
	StoredPages    int64
	StagedPages    int64 // acknowledged pages waiting in staging for their batch
	// LostPages read as EIO: Recover found their entries untrustworthy.
	LostPages    int64
	FailedReads  uint64
	FailedWrites uint64
	InvalidIO    uint64
	NotifyFree   uint64
	// PrefaultMisses is the store's count of allocations that waited for
	// its prefaulter (pagestore.Stats.PrefaultMisses).
	PrefaultMisses int64
	// TableLate counts the pages of the page table that writes faulted in
	// themselves, beyond what gzramd-table had faulted in ahead of them.
	TableLate uint64
	// StagedWrites counts page writes that were staged; CommitRetries
	// batches whose commit had to wait for store memory; UnusedSlots
	// staging slots that held no write (same-filled pages found once
	// their payload was received into staging, aborted receives).
	StagedWrites, CommitRetries, UnusedSlots uint64
	Staging                                  stage.Stats // zero without staging
	// Objects of several pages (Config.ObjectPages): the pages in them
	// (also in StoredPages), the objects, and the chunks (allocations of
	// up to a page in the store) that hold them.
	PackedPages, PackedObjects, PackedChunks int64
	// The dense tier (Config.Dense): its pages (also in PackedPages),
	// objects (also in PackedObjects) and their bytes, and the
	// recompressor's counters. The fast tier is the rest of the stored
	// pages.
	DensePages, DenseObjects, DenseBytes int64
	Dense                                DenseStats
	// DenseFramesCached and DenseFramesDecoded count the dense tier's
	// frames reads took from the cache of decoded frames, and decoded.
	DenseFramesCached, DenseFramesDecoded uint64
}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	st := d.cfg.Store.Stats()
	staged := d.stagedPages.Load()
	s := Stats{
		OrigDataSize:   (d.storedPages.Load() + staged) * pageSize,
		ComprDataSize:  st.ComprDataSize + staged*pageSize,
		MemUsedTotal:   st.MemUsed, // staged pages are reserved in the store
		MemLimit:       st.MemLimit,
		MemUsedMax:     st.MemUsedMax,
		SamePages:      d.samePages.Load(),
		PagesCompacted: st.PagesCompacted,
		HugePages:      d.hugePages.Load(),
		StoredPages:    d.storedPages.Load(),
		StagedPages:    staged,
		LostPages:      d.lostPages.Load(),
		FailedReads:    d.failedReads.Load(),
		FailedWrites:   d.failedWrites.Load(),
		InvalidIO:      d.invalidIO.Load(),
		NotifyFree:     d.notifyFree.Load(),
		PrefaultMisses: st.PrefaultMisses,
		TableLate:      d.backing.late.Load(),
		PackedPages:    d.packedPages.Load(),
		PackedObjects:  d.obj.packedObjects.Load(),
		PackedChunks:   d.obj.packedChunks.Load(),
		DensePages:     d.densePages.Load(),
		DenseObjects:   d.obj.denseObjects.Load(),
		DenseBytes:     d.obj.denseBytes.Load(),
		Dense:          d.dense.Stats(),
	}
	s.DenseFramesCached, s.DenseFramesDecoded = d.obj.frames.counts()
	if w := d.stager; w != nil {
		s.Staging = w.area.Stats()
		s.StagedWrites, s.CommitRetries, s.UnusedSlots = w.stagedWrites.Load(), w.commitRetries.Load(), w.unusedSlots.Load()
	}
	return s
}

// fillWord reports whether page repeats one 8-byte word, and which.
func fillWord(page []byte) (uint64, bool) {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&page[0])), len(page)/8)
	w := words[0]
	for _, x := range words[1:] {
		if x != w {
			return 0, false
		}
	}
	return w, true
}

func fill(dst []byte, w uint64) {
	if w == 0 {
		clear(dst)
		return
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&dst[0])), len(dst)/8)
	for i := range words {
		words[i] = w
	}
}
