// Payload buffers: each connection's budget, reserve and cache, and the server's pool.

package nbd

import (
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// payloadBudget is a connection's payload buffers: what its requests hold,
// against its budget, and the idle buffers it keeps.
type payloadBudget struct {
	mu   sync.Mutex
	cond sync.Cond // signalled when a buffer comes back
	// Bytes of buffers held by requests, those served from the reserve
	// (Options.ReserveBuffers) apart.
	used, reserveUsed int64
	// cache holds idle buffers by size class, up to retainBytes.
	cache       [numClasses][]*[]byte
	cached      int64
	retainBytes int64
	// region is the mapping the reserve's buffers are cut from
	// (reserve), nil for none.
	region []byte

	// What it needs of the connection and its server, set as the
	// transmission phase starts: the budgets of the connection's buffers
	// beyond its reserve (Options.MaxInFlightBytes, less for a
	// connection other than the process's own) and of its reserve
	// (Options.ReserveBuffers); the server's pool and its count of bytes
	// in requests' buffers; the inline runner, whose held replies hold
	// buffers; the log and the client's name (remote) for its lines.
	limit, reserveLimit int64
	pool                *bufferPool
	inUse               *atomic.Int64
	inline              *inlineRunner
	log                 *slog.Logger
	remote              func() string
}

// start sets up the buffers of a connection of s's (other, when it is not
// the process's own) as its transmission phase starts.
func (p *payloadBudget) start(s *Server, other bool, inline *inlineRunner, remote func() string) {
	p.cond.L = &p.mu
	p.limit, p.reserveLimit = s.maxInFlightBytes, s.reserveBuffers
	p.pool, p.inUse, p.inline, p.log, p.remote = s.bufs, &s.bufBytes, inline, s.log, remote
	// Twice the in-flight bound: a mix of sizes in flight changes over
	// time, and a cache that drops the buffers of one mix to keep those of
	// the last allocates all the while. Another client's connection keeps
	// no more than its budget, allocating more often for it: what it makes
	// the daemon hold stays bounded (otherMaxPayload).
	if other {
		p.limit = min(s.maxInFlightBytes, otherMaxPayload)
		p.retainBytes = p.limit
	} else {
		p.retainBytes = min(2*s.maxInFlightBytes, maxRetainBytes)
	}
}

// take gives r a payload buffer of r.length bytes, from the
// connection's own cache where it can, waiting while the connection's
// buffers exceed its budget.
func (p *payloadBudget) take(r *request) {
	class := sizeClass(r.length)
	// Requests the reserve's buffers can serve count against the reserve
	// alone: within it, they never wait for a buffer to be allocated.
	used, limit := &p.used, p.limit
	r.reserved = p.reserveLimit > 0 && r.length <= ReserveBufferMax
	if r.reserved {
		used, limit = &p.reserveUsed, p.reserveLimit
	}
	var b *[]byte
	var n int64
	p.mu.Lock()
	for {
		// The smallest free buffer that fits, so that a reserve of
		// large buffers serves every size up to theirs. The budget
		// counts the buffer's size, not the request's.
		k := class
		for k < numClasses && len(p.cache[k]) == 0 {
			k++
		}
		if k == numClasses {
			k = class // none cached: a new one of the request's size
		}
		n = 1 << (k + minClassShift)
		if *used == 0 || *used+n <= limit {
			if l := p.cache[k]; len(l) > 0 {
				b = l[len(l)-1]
				l[len(l)-1] = nil
				p.cache[k] = l[:len(l)-1]
				p.cached -= n
			}
			break
		}
		if p.inline.pending() {
			// Inline: the buffers to wait for are our own held replies'.
			p.mu.Unlock()
			p.inline.flushHeld()
			p.mu.Lock()
			continue
		}
		p.cond.Wait()
	}
	*used += n
	p.mu.Unlock()
	p.inUse.Add(n)
	if b == nil {
		b = p.pool.get(class)
	}
	r.buf, r.data = b, (*b)[:r.length]
}

// otherMaxPayload is the largest read or write a connection other than
// the process's own may send (the maximum payload its handshake
// advertises), and the payload buffers beyond its reserve that its
// requests may hold, and that it may keep idle. Such a connection may be
// any local user's (anyone's, over TCP), and under mlockall every buffer
// it makes the daemon allocate stays resident: with MaxPayload and
// MaxInFlightBytes, 8 connections that asked for 32 MiB reads and read no
// reply held 512 MiB. With this, 8 hold at most 64 MiB in requests and 64
// MiB idle. The kernel device's connections keep MaxPayload and
// MaxInFlightBytes: nothing may starve them. 8 MiB is above the 1 MiB the
// protocol asks a server to accept, the 1280 KiB a Linux client's device
// sends by default (max_sectors_kb) and nbdcopy's 256 KiB; qemu keeps to
// the maximum advertised. It is no option: no client but the kernel
// device needs more to be served well.
const otherMaxPayload = 8 << 20

// maxPayload is the largest read or write c accepts.
func (c *conn) maxPayload() uint32 {
	if c.other {
		return otherMaxPayload
	}
	return MaxPayload
}

// put takes back r's buffer. The connection keeps up to retainBytes of
// buffers for itself and unmaps the rest: a swap device under memory
// pressure is exactly where mapping a fresh buffer for each request must
// not happen.
func (p *payloadBudget) put(r *request) {
	b := r.buf
	if b == nil {
		return
	}
	r.buf, r.data = nil, nil
	n := int64(cap(*b))
	p.inUse.Add(-n)
	p.mu.Lock()
	if r.reserved {
		p.reserveUsed -= n
	} else {
		p.used -= n
	}
	// A reserve buffer always goes back to the reserve (reserved
	// requests never allocate, so these are never more than it).
	keep := p.cached+n <= p.retainBytes || r.reserved && n == ReserveBufferMax
	if keep {
		class := sizeClass(uint32(n))
		p.cache[class] = append(p.cache[class], b)
		p.cached += n
	}
	p.mu.Unlock()
	p.cond.Signal()
	if !keep {
		p.pool.put(b)
	}
}

// ReserveBufferMax is the size of the buffers of Options.ReserveBuffers,
// and so the largest request they serve.
const ReserveBufferMax = 128 << 10

// reserve fills the connection's buffer cache with n bytes of
// buffers of ReserveBufferMax, written so that they are resident (locked,
// under mlockall). One serves a request of any size up to its own, and
// the reserve's budget counts it whole, so such requests never need a
// buffer the reserve does not have.
//
// The buffers are one mapping of their own, outside the Go heap, unmapped
// as the connection closes (release). On the heap they would stay
// resident for ever once freed: under mlockall the runtime cannot give
// locked pages back (madvise refuses them), so every connection ever
// opened would leave its reserve behind.
func (p *payloadBudget) reserve(n int64) {
	if n <= 0 {
		return
	}
	count := max(1, n/ReserveBufferMax)
	p.retainBytes += n
	class := sizeClass(ReserveBufferMax)
	p.mu.Lock()
	defer p.mu.Unlock()
	mem, err := unix.Mmap(-1, 0, int(count*ReserveBufferMax), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// Served all the same, from the heap: the connection works,
		// its reserve just stays behind it.
		p.log.Warn("nbd: mapping a connection's reserve buffers; taking them from the heap", "remote", p.remote(), "bytes", count*ReserveBufferMax, "err", err)
		mem = make([]byte, count*ReserveBufferMax)
	} else {
		p.region = mem
	}
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0
	}
	for i := range count {
		b := mem[i*ReserveBufferMax : (i+1)*ReserveBufferMax : (i+1)*ReserveBufferMax]
		p.cache[class] = append(p.cache[class], &b)
		p.cached += ReserveBufferMax
	}
}

// release unmaps the connection's cached buffers and its reserve. Every request has ended by now, and a reserve
// buffer always returns to the cache (put), so none is in use.
func (p *payloadBudget) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	region := p.region
	var back int
	for class, l := range p.cache {
		for _, b := range l {
			if inRegion(*b, region) {
				back++
				continue
			}
			p.pool.put(b)
		}
		clear(l)
		p.cache[class] = nil
	}
	p.cached = 0
	if region == nil {
		return
	}
	p.region = nil
	if want := len(region) / ReserveBufferMax; back != want {
		// Unmapping a buffer still referenced would turn a bug into a
		// crash of the daemon that serves swap: keep it mapped.
		p.log.Error("nbd: a connection's reserve buffers are not all back; leaving them mapped", "remote", p.remote(), "back", back, "want", want)
		return
	}
	if err := unix.Munmap(region); err != nil {
		p.log.Error("nbd: unmapping a connection's reserve buffers", "remote", p.remote(), "err", err)
	}
}

// inRegion reports whether b lies within region.
func inRegion(b, region []byte) bool {
	if len(region) == 0 || cap(b) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(region)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p < start+uintptr(len(region))
}

// bufferPool hands out payload buffers in power-of-two size classes from
// 4 KiB to MaxPayload, each a mapping of its own, and unmaps those given
// back. Connections keep their own cache in front of it (payloadBudget.put); the
// pool keeps nothing. On the heap a freed buffer would stay resident for
// ever: under mlockall the runtime cannot give locked pages back, so the
// largest burst of requests ever served (nbdcopy's 8 connections of 256
// KiB requests: 39 MiB at 16 threads) would stay on as the daemon's own
// memory, and grow with what it stored.
type bufferPool struct {
	made atomic.Int64 // buffers allocated: Server.PayloadBuffersAllocated
	// onHeap holds the buffers made on the heap when a mapping was
	// refused, which go back to the runtime rather than to munmap.
	mu     sync.Mutex
	onHeap map[*byte]struct{}
}

const (
	minClassShift = 12 // 4 KiB
	maxClassShift = 25 // MaxPayload, 32 MiB
	numClasses    = maxClassShift - minClassShift + 1
	// maxReserveBytes bounds Options.ReserveBuffers.
	maxReserveBytes = 64 << 20
)

func newBufferPool() *bufferPool { return &bufferPool{} }

func sizeClass(n uint32) int {
	shift := bits.Len32(n - 1)
	if shift < minClassShift {
		shift = minClassShift
	}
	return shift - minClassShift
}

// classBytes is the size of the buffers of n's class.
func classBytes(n uint32) int64 { return 1 << (sizeClass(n) + minClassShift) }

// get returns a buffer of the class (its full size; callers cut it).
func (p *bufferPool) get(class int) *[]byte {
	p.made.Add(1)
	n := 1 << (class + minClassShift)
	mem, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// Served all the same: the request works, its buffer just
		// stays behind it.
		b := make([]byte, n)
		p.mu.Lock()
		if p.onHeap == nil {
			p.onHeap = make(map[*byte]struct{})
		}
		p.onHeap[&b[0]] = struct{}{}
		p.mu.Unlock()
		return &b
	}
	b := unsafe.Slice((*byte)(mem), n)
	return &b
}

// put unmaps b, which no request may reference any more.
func (p *bufferPool) put(b *[]byte) {
	first := unsafe.SliceData(*b)
	p.mu.Lock()
	_, heap := p.onHeap[first]
	delete(p.onHeap, first)
	p.mu.Unlock()
	if heap {
		return
	}
	// munmap fails only for a range that is not a mapping of the
	// pool's; leaving it mapped costs memory, never a page.
	unix.MunmapPtr(unsafe.Pointer(first), uintptr(cap(*b)))
}
