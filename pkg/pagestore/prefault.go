// The prefaulter thread: store memory faulted in ahead of use, emptied slabs given back off the writers' path.

package pagestore

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/internal/osthread"
)

// prefaulter is the thread that keeps arena memory faulted in ahead of
// carve, and gives emptied slabs' pages back, so that no writer faults or
// waits on the kernel on the path that stores a swapped-out page (see
// Config.Prefault and Store.release). It owns the spare arena, how far
// the last arena is faulted, and the queue of slabs to release.
type prefaulter struct {
	s *Store

	prefault int64 // Config.Prefault; 0: no prefaulter, and no thread
	quiet    time.Duration

	// spare is the next arena, mapped and faulted ahead, taken by carve
	// when the last arena is full; faultedTo is the first page of the
	// last arena not yet touched. They are carve's too: all four are
	// guarded by the store's mu.
	spare        []byte
	spareArena   int // the arena spare maps
	spareFaulted int // pages of spare touched
	faultedTo    int
	// touching is the step of pages the thread is faulting in now,
	// without the lock: the marks above already count it.
	touching pageRange

	// ready is closed, and replaced, each time the thread makes memory
	// ready (a step faulted in, a released slab warmed), waking the
	// allocations that wait for it (await); readyTaken says whether one
	// took it since, so that steps nobody waits for make no channel.
	// stalled says the thread made nothing ready for PrefaultWait while
	// an allocation waited (stallTimer, armed at armedAt), and stopped
	// that the thread is gone: allocations then fail without waiting.
	// All are guarded by the store's mu.
	ready      chan struct{}
	readyTaken bool
	stalled    bool
	stopped    bool
	stallTimer *time.Timer
	armed      bool
	armedAt    time.Time
	// recsTo is how many slab records the thread has faulted in: carve
	// makes no slab beyond (under the store's mu).
	recsTo int
	// largest is the pages of the largest slab: the spare arena holds
	// that many faulted in while the last arena may not fit the next.
	largest int
	// tails are the pages faulted ahead at the end of arenas that carve
	// left, the next slab not fitting there: the thread gives them back
	// (giveBackTails). A fixed few, so that carve allocates nothing;
	// where they are all taken, the tail stays resident until a
	// takeover's Recover gives it back.
	tails  [4]pageRange
	ntails int
	// hasTails is set with a tail and cleared as they go, so that the
	// thread takes mu for them only when there are some.
	hasTails atomic.Bool

	refill     chan struct{}
	stopRefill chan struct{}
	refillDone chan struct{}
	stopOnce   sync.Once

	// releases are emptied slabs whose pages the prefaulter gives back,
	// so that no writer does: see Store.release.
	relMu    sync.Mutex
	releases []pendingRelease
	// releasing is the prefaulter's copy of releases, swapped with it.
	releasing []pendingRelease
}

// pageRange is pages [from, to) of arena arena; arena -1 names none.
type pageRange struct{ arena, from, to int }

// overlaps reports whether r holds any of the n pages of arena from page.
func (r pageRange) overlaps(arena, from, n int) bool {
	return r.arena == arena && from < r.to && r.from < from+n
}

// pendingRelease is an emptied slab waiting for its pages to go back. It
// is on no list of its class until they have.
type pendingRelease struct {
	id    uint32
	class uint16
	pages uint16
}

// maxPendingReleases bounds the queue of slabs the prefaulter releases;
// beyond it, the thread that emptied a slab releases it itself.
const maxPendingReleases = 4096

// start starts the thread, if the store has a prefaulter.
func (p *prefaulter) start() {
	if p.prefault == 0 {
		return
	}
	p.refill = make(chan struct{}, 1)
	p.stopRefill = make(chan struct{})
	p.refillDone = make(chan struct{})
	p.ready = make(chan struct{})
	p.stallTimer = time.AfterFunc(PrefaultWait, p.stall)
	p.stallTimer.Stop()
	p.releases = make([]pendingRelease, 0, maxPendingReleases)
	p.releasing = make([]pendingRelease, 0, maxPendingReleases)
	go osthread.Run("gzramd-prefault", p.run)
	p.refill <- struct{}{}
}

// stop ends the thread and waits for it, if it was started: it touches
// arenas without the store's lock, so it must be gone before they are
// unmapped.
func (p *prefaulter) stop() {
	if p.stopRefill == nil {
		return
	}
	p.stopOnce.Do(func() { close(p.stopRefill) })
	<-p.refillDone
	p.s.mu.Lock()
	p.stopped = true
	p.stallTimer.Stop()
	p.wakeLocked() // the waiting allocations give up
	p.s.mu.Unlock()
}

// expect returns the channel the thread's next step closes (nil without
// a prefaulter). Taken before an allocation looks for memory, it cannot
// miss a step made while it looks.
func (p *prefaulter) expect() <-chan struct{} {
	if p.prefault == 0 {
		return nil
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.readyTaken = true
	return p.ready
}

// signal wakes the allocations waiting for memory: the thread made some
// ready.
func (p *prefaulter) signal() {
	p.s.mu.Lock()
	p.signalLocked()
	p.s.mu.Unlock()
}

// signalLocked is signal with the store's mu held.
func (p *prefaulter) signalLocked() {
	p.stalled = false
	if p.armed {
		p.armed = false
		p.stallTimer.Stop()
	}
	p.wakeLocked()
}

// wakeLocked wakes the allocations waiting on ready. The store's mu is
// held.
func (p *prefaulter) wakeLocked() {
	if p.readyTaken {
		close(p.ready)
		p.ready, p.readyTaken = make(chan struct{}), false
	}
}

// stall runs PrefaultWait after an allocation began to wait for the
// thread, unless it made memory ready since: the thread is itself
// waiting on reclaim, perhaps for this very store's writes. The waiting
// allocations fail, and the next fail at once (await), so that the kernel
// keeps pages whose swap writes fail rather than each write hold up its
// request in turn.
func (p *prefaulter) stall() {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if !p.armed || time.Since(p.armedAt) < PrefaultWait {
		return // it made memory ready, or another wait began since
	}
	p.armed, p.stalled = false, true
	p.wakeLocked()
}

// await waits, with c.mu released, until the thread makes memory ready
// after ready was taken (expect), and reports whether it did; it gives up
// when the thread stalls (stall), and does not wait while it is stalled.
// c.mu is held.
func (p *prefaulter) await(c *class, ready <-chan struct{}) bool {
	select {
	case <-ready:
		return true
	default:
	}
	s := p.s
	s.mu.Lock()
	if p.stalled || p.stopped || ready == nil {
		s.mu.Unlock()
		return false
	}
	if !p.armed {
		p.armed, p.armedAt = true, time.Now()
		p.stallTimer.Reset(PrefaultWait)
	}
	s.mu.Unlock()
	c.mu.Unlock()
	<-ready
	c.mu.Lock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return !p.stalled && !p.stopped
}

// queue hands an emptied slab to the thread to release, unless the queue
// is full (or there is no thread), and reports whether it did.
func (p *prefaulter) queue(r pendingRelease) bool {
	if p.prefault == 0 {
		return false
	}
	p.relMu.Lock()
	queued := len(p.releases) < cap(p.releases)
	if queued {
		p.releases = append(p.releases, r)
	}
	p.relMu.Unlock()
	return queued
}

// run keeps Config.Prefault bytes of arena faulted in ahead of carve,
// woken by carve and every 100ms, and less once the store has carved
// nothing for Config.PrefaultQuiet: what is held ahead covers a burst of
// writes while the prefaulter catches up, and between bursts it is
// memory the machine lacks. How much less follows the write rate
// (idleAhead): twice the most carved in 100 ms lately, between an eighth
// and half of Prefault, so that a daemon whose writes come slowly holds
// 2 MiB between them rather than 8. It runs on a thread of its own, named
// gzramd-prefault, so that a stack dump (sysrq-t, top -H) shows whether
// the one thread allowed to wait on reclaim is doing so.
func (p *prefaulter) run() {
	defer close(p.refillDone)
	t := time.NewTicker(rateWindow)
	defer t.Stop()
	carved, active := p.carved(), time.Now()
	var rate carveRate
	rate.start(carved, active)
	for {
		select {
		case <-p.stopRefill:
			return
		case <-p.refill:
		case <-t.C:
		}
		p.releaseQueued()
		p.warmReleased()
		ahead := p.prefault
		now, c := time.Now(), p.carved()
		rate.observe(c, now)
		if c != carved {
			carved, active = c, now
		} else if now.Sub(active) >= p.quiet {
			ahead = p.idleAhead(rate.peak)
			p.shrinkAhead(int(ahead / pageSize))
		}
		p.prefaultAhead(int(ahead / pageSize))
	}
}

// idleAhead is what the prefaulter holds ahead of carve while no write
// comes: enough for twice the most the store has carved in rateWindow
// lately (peak pages), between an eighth and half of Prefault. The burst
// that ends a quiet spell is met by the pages held and then by the
// thread, which writers wait for where it falls behind (await).
func (p *prefaulter) idleAhead(peak int) int64 {
	return min(max(2*int64(peak)*pageSize, p.prefault/8), p.prefault/2)
}

// rateWindow is the window carveRate measures carving over.
const rateWindow = 100 * time.Millisecond

// carveRate is the most pages carved in one rateWindow, decaying: by a
// 600th a window, so that a burst is remembered for about a minute.
type carveRate struct {
	from   time.Time
	carved int
	peak   int
}

func (r *carveRate) start(carved int, now time.Time) { r.from, r.carved = now, carved }

// observe notes that carve had reached carved at now, and closes the
// window once it is rateWindow long.
func (r *carveRate) observe(carved int, now time.Time) {
	if now.Sub(r.from) < rateWindow {
		return
	}
	r.peak = max(r.peak-(r.peak+599)/600, carved-r.carved)
	r.start(carved, now)
}

// leaveTail notes that carve leaves the last arena, whose pages from
// next up to what the thread faulted in are never to be carved: the
// thread gives them back. Without it they stayed resident and counted
// nowhere, about 100 KiB an 8 MiB arena (3.6 MiB with 1 GiB of the shared
// corpus stored, issue 39). The store's mu is held.
func (p *prefaulter) leaveTail(arena, next int) {
	if p.prefault == 0 || p.faultedTo <= next || p.ntails == len(p.tails) {
		return
	}
	p.tails[p.ntails] = pageRange{arena: arena, from: next, to: p.faultedTo}
	p.ntails++
	p.hasTails.Store(true)
}

// giveBackTails punches out the arena tails carve left. No carve takes
// those pages again, so the store's mu is not held while they go.
func (p *prefaulter) giveBackTails() {
	if !p.hasTails.Load() {
		return
	}
	s := p.s
	s.mu.Lock()
	tails, n := p.tails, p.ntails
	p.ntails = 0
	p.hasTails.Store(false)
	s.mu.Unlock()
	for _, t := range tails[:n] {
		if s.closed.Load() {
			return
		}
		if err := s.files.Arenas.Punch(int64(t.arena)*int64(s.arenaSize)+int64(t.from)*pageSize, int64(t.to-t.from)*pageSize); err != nil {
			s.releaseErrors.Add(1)
		}
	}
}

// carved is how far carve has gone, in pages: the arenas before the last
// and the carve point in it.
func (p *prefaulter) carved() int {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(len(*s.arenas.Load())-1, 0)*(s.arenaSize/pageSize) + s.arenaNext
}

// prefaultStep is the pages the prefaulter touches, or gives back,
// between looks at the carve point.
const prefaultStep = 64

// shrinkAhead gives back the pages faulted ahead of carve beyond want,
// the furthest first, a step at a time. It punches them out with mu held:
// carve must never take a page while it is being given back.
func (p *prefaulter) shrinkAhead(want int) {
	s := p.s
	want = max(want, p.largest)
	for {
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			return
		}
		arenas := *s.arenas.Load()
		ahead, spare, keepSpare := 0, 0, 0
		if len(arenas) > 0 {
			ahead = max(p.faultedTo-s.arenaNext, 0)
			keepSpare = p.spareFloor(s.arenaSize/pageSize - s.arenaNext)
		}
		if p.spare != nil {
			spare = p.spareFaulted
		}
		over := ahead + spare - want
		var err error
		if n := min(over, spare-keepSpare, prefaultStep); n > 0 {
			p.spareFaulted -= n
			err = s.files.Arenas.Punch(int64(p.spareArena)*int64(s.arenaSize)+int64(p.spareFaulted)*pageSize, int64(n)*pageSize)
		} else if n := min(over, ahead, prefaultStep); n > 0 {
			p.faultedTo -= n
			err = s.files.Arenas.Punch(int64(len(arenas)-1)*int64(s.arenaSize)+int64(p.faultedTo)*pageSize, int64(n)*pageSize)
		} else {
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if err != nil {
			s.releaseErrors.Add(1)
			return
		}
	}
}

// releaseQueued gives the queued slabs' pages back to the kernel and then
// returns the slabs to their classes for reuse.
func (p *prefaulter) releaseQueued() {
	s := p.s
	p.relMu.Lock()
	p.releases, p.releasing = p.releasing[:0], p.releases
	p.relMu.Unlock()
	for i, q := range p.releasing {
		if s.closed.Load() {
			return
		}
		c, g := &s.classes[q.class], &s.geo[q.class]
		r := s.rec(q.id)
		if err := s.releasePages(r, s.slabMem(r, g)[:int(q.pages)*pageSize]); err != nil {
			s.releaseErrors.Add(1)
		}
		c.mu.Lock()
		c.pushEmpty(q.id, p.prefault > 0)
		c.mu.Unlock()
		p.releasing[i] = pendingRelease{}
	}
}

// warmReleased faults in again the pages of released slabs, so that each
// class has on top of its empty stack a resident one, and as many as its
// writers carved since the last round because it had none (wantWarm),
// while the empty slabs kept or warmed hold less than Prefault bytes.
// newSlab reuses only resident ones (a fault there would be on the path
// that stores a swapped-out page): without this, a class whose slabs were
// released would carve new ones from the arenas for ever, and the store's
// address space and slab records would grow without bound under churn.
func (p *prefaulter) warmReleased() {
	s := p.s
	budget := int(p.prefault/pageSize - s.keptEmpty.Load() - s.warmEmpty.Load())
	for ci := range s.classes {
		c, g := &s.classes[ci], &s.geo[ci]
		c.mu.Lock()
		want := c.wantWarm
		if n := len(c.empty); want == 0 && n > 0 && s.rec(c.empty[n-1]).touched == 0 && s.rec(c.empty[n-1]).cold {
			want = 1 // none resident on top
		}
		c.mu.Unlock()
		warmed, none := 0, false
		for ; warmed < want && budget > 0; warmed++ {
			if s.closed.Load() {
				return
			}
			c.mu.Lock()
			// The resident ones are on top, the released ones below.
			i := len(c.empty) - 1
			for i >= 0 && !(s.rec(c.empty[i]).touched == 0 && s.rec(c.empty[i]).cold) {
				i--
			}
			if i < 0 {
				none = true
				c.mu.Unlock()
				break
			}
			// Off the stack while its pages fault in, so nobody takes it.
			id := c.empty[i]
			c.empty = append(c.empty[:i], c.empty[i+1:]...)
			c.mu.Unlock()
			r := s.rec(id)
			memfd.Populate(s.slabMem(r, g))
			budget -= int(g.pages)
			s.warmEmpty.Add(int64(g.pages))
			c.mu.Lock()
			r.cold = false
			c.empty = append(c.empty, id)
			c.mu.Unlock()
			p.signal()
		}
		// What the budget left is for the next round; with no released
		// slab left, there is nothing to warm.
		c.mu.Lock()
		if c.wantWarm = max(c.wantWarm-warmed, 0); none {
			c.wantWarm = 0
		}
		c.mu.Unlock()
	}
}

// prefaultAhead touches the pages between the carve point and Prefault
// bytes beyond it, mapping the spare arena when the last one runs short.
// It touches without holding mu (a fault may wait on reclaim; carve must
// not wait with it), with an atomic add of zero: carve may hand out a page
// while it is being touched, and the add changes no byte a slab wrote.
func (p *prefaulter) prefaultAhead(want int) {
	s := p.s
	want = max(want, p.largest)
	for {
		// Writers carve as the thread faults, and may leave an arena
		// each time it makes a spare.
		p.giveBackTails()
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			return
		}
		// The slab records first: carveSlab writes one for each new
		// slab, of a page at the least.
		if recs := min(int(s.nslabs.Load())+want+prefaultStep, maxSlabs); p.recsTo < recs {
			from := p.recsTo
			s.mu.Unlock()
			memfd.Populate(s.recordPages(from, recs))
			s.mu.Lock()
			p.recsTo = max(p.recsTo, recs)
			p.signalLocked()
			s.mu.Unlock()
			continue
		}
		arenas := *s.arenas.Load()
		spareWant := want
		var mem []byte
		from := 0
		if len(arenas) > 0 {
			last := arenas[len(arenas)-1]
			ahead := p.faultedTo - s.arenaNext
			if p.faultedTo < s.arenaNext {
				p.faultedTo, ahead = s.arenaNext, 0
			}
			spareWant = p.spareWant(want, ahead, len(last)/pageSize-s.arenaNext)
			switch {
			case ahead < want && p.faultedTo < len(last)/pageSize:
				mem, from = last, p.faultedTo
				p.faultedTo = min(p.faultedTo+prefaultStep, len(last)/pageSize)
				p.touching = pageRange{len(arenas) - 1, from, p.faultedTo}
			case spareWant <= 0:
				s.mu.Unlock()
				return
			}
		}
		if mem == nil {
			// The last arena is faulted to its end: get the spare ready,
			// mapping it without the lock (carve must not wait on mmap).
			if p.spare == nil {
				k := len(arenas)
				s.mu.Unlock()
				spare, err := s.mapArena(k)
				if err != nil {
					return
				}
				s.mu.Lock()
				if p.spare != nil || s.closed.Load() || len(*s.arenas.Load()) != k {
					s.mu.Unlock()
					_ = unix.Munmap(spare)
					continue
				}
				p.spare, p.spareArena = spare, k
				p.spareFaulted = 0
			}
			if p.spareFaulted >= min(spareWant, len(p.spare)/pageSize) {
				s.mu.Unlock()
				return
			}
			mem, from = p.spare, p.spareFaulted
			p.spareFaulted = min(p.spareFaulted+prefaultStep, len(p.spare)/pageSize)
			p.touching = pageRange{p.spareArena, from, p.spareFaulted}
		}
		s.mu.Unlock()
		memfd.Populate(mem[from*pageSize : min(from+prefaultStep, len(mem)/pageSize)*pageSize])
		s.mu.Lock()
		p.touching = pageRange{arena: -1}
		p.signalLocked()
		s.mu.Unlock()
	}
}

// recordPages is the memory of slab records [from, to), in whole pages.
func (m *mapping) recordPages(from, to int) []byte {
	all := m.recordBytes()
	lo := from * int(slabRecSize) &^ (pageSize - 1)
	hi := min((to*int(slabRecSize)+pageSize-1)&^(pageSize-1), len(all))
	return all[lo:hi]
}

// spareWant is the pages of the spare arena to hold faulted in, when
// want pages are wanted ahead of carve and the last arena has ahead
// faulted and room left to carve: the rest of want, and at least
// spareFloor.
func (p *prefaulter) spareWant(want, ahead, room int) int {
	return max(want-ahead, p.spareFloor(room))
}

// spareFloor is the pages of the spare arena held faulted in whatever is
// wanted, when the last arena has room pages left to carve: a whole slab
// of the largest class where the next slab may not fit the last arena.
func (p *prefaulter) spareFloor(room int) int {
	if room < p.largest {
		return p.largest
	}
	return 0
}

// unmapSpare unmaps the spare arena, if there is one. The store's mu is
// held.
func (p *prefaulter) unmapSpare() error {
	if p.spare == nil {
		return nil
	}
	err := unix.Munmap(p.spare)
	p.spare = nil
	if err != nil {
		return fmt.Errorf("pagestore: munmap spare arena: %w", err)
	}
	return nil
}

// wake asks the prefaulter for a round now rather than at its
// next tick.
func (p *prefaulter) wake() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}
