// The GPU's batch: groups queued, compressed together, committed.

package dense

import (
	"context"
	"fmt"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

const (
	// gpuTimeout bounds a batch of groups on the GPU: past it the tier
	// gives the GPU up and recompresses on the CPU.
	gpuTimeout = 10 * time.Second
	// gpuGroups is the most groups a batch holds: 4 MiB of pinned
	// memory, a batch every few milliseconds, some 290 MB of idle pages
	// a second (bench/results/dense-gpu-h100-2026-11-26.md), more than
	// swap ages.
	gpuGroups = 32
)

// gpuBatch is the recompressor's batch on a GPU: the groups snapshotted
// into b's pages, compressed together by one CompressGroups.
type gpuBatch struct {
	gc codec.GroupCompressor
	// framePages is gc's pages a frame, perGroup its frames a group.
	framePages, perGroup int
	b                    *codec.Batch
	queued               []queuedGroup
	snaps                []Snapshot
	// Compressed pages go to a GPU that decodes the device's codec as
	// they are stored, packed into the batch's output (packedAt bytes of
	// it so far), and are decoded there: page i of the batch at
	// packed.Offsets[i], packed.Lens[i] bytes (0: the page is decoded
	// into the batch's pages already). Without Lens, every page is.
	packed   codec.Packed
	packedAt int
	// group is where the device leaves a group's compressed pages, made
	// once: it goes to the device through an interface.
	group PackedPages
}

// queuedGroup is a group waiting in the GPU's batch: its index, its age
// when snapshotted, and what the snapshot found.
type queuedGroup struct {
	g, age         uint32
	stored, before int
}

// SetGPU has the tier recompress on gc from now on, in batches of its
// pinned memory (allocated here: 4 MiB for up to gpuGroups groups). The
// device's compressed pages go to it as they are stored, to be decoded
// there, where it decodes their codec (gc.Decodes). It does nothing
// for a nil Tier.
func (t *Tier) SetGPU(gc codec.GroupCompressor) error {
	if t == nil {
		return nil
	}
	groups := min(gc.MaxGroups(), gpuGroups)
	if groups < 1 {
		return fmt.Errorf("device: dense tier: the GPU takes %d groups at a time", groups)
	}
	per := gc.FramePages()
	if per < FramePages || per > GroupPages || GroupPages%per != 0 {
		return fmt.Errorf("device: dense tier: the GPU writes frames of %d pages, not a divisor of %d of at least %d", per, GroupPages, FramePages)
	}
	b, err := gc.NewBatch(groups * GroupPages)
	if err != nil {
		return fmt.Errorf("device: dense tier: the GPU's batch: %w", err)
	}
	// Written now, not first by the recompressor: faulted in here.
	clear(b.Pages)
	clear(b.Out)
	q := &gpuBatch{gc: gc, framePages: per, perGroup: GroupPages / per, b: b,
		queued: make([]queuedGroup, 0, groups), snaps: make([]Snapshot, groups)}
	if gc.Decodes(t.codec) {
		q.packed = codec.Packed{Codec: t.codec, Offsets: make([]uint32, groups*GroupPages), Lens: make([]uint32, groups*GroupPages)}
	}
	t.gpu.Store(q)
	return nil
}

// OnGPU reports whether the tier recompresses on a GPU.
func (t *Tier) OnGPU() bool { return t != nil && t.gpu.Load() != nil }

// queue snapshots group g, of age age, into the GPU's batch. It reports
// false where the group is for the CPU (the device's last group, when
// short).
func (t *Tier) queue(q *gpuBatch, g, age uint32) bool {
	lo := g << GroupShift
	if t.pages-lo < GroupPages {
		return false
	}
	i := len(q.queued)
	raw := q.b.Pages[i*GroupPages*PageSize : (i+1)*GroupPages*PageSize]
	var packed *PackedPages
	if q.packed.Lens != nil {
		packed = &q.group
		*packed = PackedPages{Packed: q.b.Out, At: q.packedAt,
			Offsets: q.packed.Offsets[i*GroupPages : (i+1)*GroupPages], Lens: q.packed.Lens[i*GroupPages : (i+1)*GroupPages]}
	}
	stored, before, err := t.dev.Snapshot(g, GroupPages, &q.snaps[i], raw, packed)
	switch {
	case err != nil:
		t.settle(g, age, true, err)
	case stored < 0:
	case stored == 0: // none, or as dense as it gets
		t.settle(g, age, true, nil)
	default:
		q.queued = append(q.queued, queuedGroup{g: g, age: age, stored: stored, before: before})
		if packed != nil {
			q.packedAt = packed.At
		}
	}
	return true
}

// flushGPU compresses the groups queued on the GPU and commits them; a
// group the GPU declines is recompressed on the CPU. If the GPU fails, the
// tier gives it up (it may still write the batch's output) and goes on
// on the CPU, with this batch's groups. It returns the time it waited for
// the GPU.
func (t *Tier) flushGPU(ctx context.Context, q *gpuBatch) time.Duration {
	b := q.b
	b.N = len(q.queued) * GroupPages
	packed := q.packed
	if packed.Lens != nil {
		packed.Offsets, packed.Lens = packed.Offsets[:b.N], packed.Lens[:b.N]
	}
	cctx, cancel := context.WithTimeout(ctx, gpuTimeout)
	start := time.Now()
	err := q.gc.CompressGroups(cctx, b, packed)
	waited := time.Since(start)
	cancel()
	t.gpuTime.Add(int64(waited))
	if err != nil {
		t.gpu.Store(nil)
		t.log.Error("dense tier: recompression on the GPU failed; recompressing on the CPU from now on", "err", err)
	}
	for i, qg := range q.queued {
		var frames []Frame
		var size int
		notSmaller := false
		if err == nil {
			frames, size, notSmaller = t.gpuFrames(q, i)
		}
		var settled bool
		var cerr error
		switch {
		case frames != nil && size < qg.before:
			t.onGPU.Add(1)
			settled, cerr = t.commit(qg.g, qg.age, &q.snaps[i], frames, qg.before, qg.stored)
		case frames != nil || notSmaller:
			// Not smaller: the CPU's would not be either. Committed
			// without frames, so that the device keeps the group as
			// the CPU's path has it kept: in long-lived slabs, not
			// pinning the fast tier's that the pass empties.
			t.onGPU.Add(1)
			settled, cerr = t.commit(qg.g, qg.age, &q.snaps[i], nil, qg.before, qg.stored)
		default:
			if err == nil {
				t.declined.Add(1)
			}
			// Its pages may be in the batch only as stored: the CPU
			// takes the group from the table again.
			settled, cerr = t.recompress(qg.g, qg.age)
		}
		t.settle(qg.g, qg.age, settled, cerr)
	}
	q.queued = q.queued[:0]
	q.packedAt = 0
	return waited
}

// gpuFrames returns the frames the GPU made of queued group i, those of
// its stored pages, and their bytes together; nil where one of them is
// missing, with notSmaller set where one would not be smaller than its
// pages.
func (t *Tier) gpuFrames(q *gpuBatch, i int) (frames []Frame, size int, notSmaller bool) {
	b, per, stored := q.b, q.framePages, q.snaps[i].Stored
	frames = t.frames[:0]
	for k := range q.perGroup {
		first := k * per
		if stored>>first&(1<<per-1) == 0 {
			continue // pages of none, or zero-filled: they need no frame
		}
		f := i*q.perGroup + k
		data := b.Compressed(f)
		if data == nil {
			return nil, 0, b.Offsets[f] == codec.GroupNotSmaller
		}
		frames = append(frames, Frame{First: first, Pages: per, Data: data})
		size += len(data)
	}
	return frames, size, false
}
