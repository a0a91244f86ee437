// The kernel device's self-test before it becomes swap.

package swapctl

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Before the kernel device becomes swap, gzramd writes, reads back and
// discards a few MiB through it. This proves the whole path (kernel NBD
// client, sockets, batcher, codec, store) returns what was written, and it
// makes every part of that path fault in the memory it will need: the
// server's per-connection goroutines and buffers, the runtime's threads
// and their stacks, the codec's states, the store's first slabs. Once the
// device is swap, the kernel may ask gzramd to store pages exactly when it
// has no free page to give it, so whatever is still untouched then may
// never be touched at all: the guest freezes.

// SelfTestBytes is how much of the device the self-test writes.
const SelfTestBytes = 16 << 20

// selfTestChunks are the request sizes it uses: single pages, as the
// kernel swaps out under pressure, and clusters, as it swaps out in bulk.
var selfTestChunks = []int{4096, 64 << 10, 4096, 128 << 10}

// SelfTest writes a varied pattern (zero, same-filled, compressible and
// random pages) over the first SelfTestBytes of dev with O_DIRECT from
// workers goroutines at once, reads it back and compares, then discards
// it so the kernel sees an empty device.
func SelfTest(ctx context.Context, dev string, size int64, workers int) error {
	span := min(size, SelfTestBytes)
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return fmt.Errorf("self-test: %w", err)
	}
	defer f.Close()

	chunks := splitSelfTest(span)
	err = runSelfTest(ctx, chunks, workers, func(buf, _ []byte, c selfTestChunk) error {
		fillSelfTest(buf, c.off)
		if _, err := f.WriteAt(buf, c.off); err != nil {
			return fmt.Errorf("self-test: writing %d bytes at %d: %w", len(buf), c.off, err)
		}
		return nil
	})
	if err == nil {
		err = runSelfTest(ctx, chunks, workers, func(buf, want []byte, c selfTestChunk) error {
			return verifySelfTest(f, buf, want, c)
		})
	}
	// Discard even after a failure: the device must not look used.
	rng := [2]uint64{0, uint64(span)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng))); errno != 0 && err == nil {
		err = fmt.Errorf("self-test: discarding the first %d bytes: %w", span, errno)
	}
	return err
}

// selfTestChunk is one request of the self-test: n bytes at byte off.
type selfTestChunk struct{ off, n int64 }

// splitSelfTest cuts the first span bytes into requests of the sizes in
// selfTestChunks, in turn. Workers take chunks in turn, so requests of
// every size run at once.
func splitSelfTest(span int64) []selfTestChunk {
	var chunks []selfTestChunk
	for off, i := int64(0), 0; off < span; i++ {
		n := min(int64(selfTestChunks[i%len(selfTestChunks)]), span-off)
		chunks = append(chunks, selfTestChunk{off, n})
		off += n
	}
	return chunks
}

// runSelfTest runs do on every chunk from workers goroutines, each with
// its own buffers for the chunk (buf) and for what it should hold (want),
// until ctx is done. It returns the first error, or ctx's.
func runSelfTest(ctx context.Context, chunks []selfTestChunk, workers int, do func(buf, want []byte, c selfTestChunk) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan selfTestChunk)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// O_DIRECT wants page-aligned buffers; mmap gives them.
			mem, err := unix.Mmap(-1, 0, 2*(128<<10), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
			if err == nil {
				defer unix.Munmap(mem)
			}
			for c := range next {
				if err == nil {
					err = do(mem[:c.n], mem[128<<10:][:c.n], c)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, c := range chunks {
		if ctx.Err() != nil {
			break
		}
		next <- c
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// verifySelfTest reads chunk c back into buf and compares it, page by
// page, with the pattern written there, made in want.
func verifySelfTest(f *os.File, buf, want []byte, c selfTestChunk) error {
	if _, err := f.ReadAt(buf, c.off); err != nil {
		return fmt.Errorf("self-test: reading %d bytes at %d: %w", len(buf), c.off, err)
	}
	fillSelfTest(want, c.off)
	for p := 0; p < len(buf); p += 4096 {
		if string(buf[p:p+4096]) != string(want[p:p+4096]) {
			return fmt.Errorf("self-test: the page at byte %d read back different from what was written", c.off+int64(p))
		}
	}
	return nil
}

// fillSelfTest fills buf, which lies at byte off of the device, with one
// kind of page per 4 KiB by page number: the kinds the device stores
// differently (zero, same-filled, compressible, incompressible).
func fillSelfTest(buf []byte, off int64) {
	for p := 0; p < len(buf); p += 4096 {
		page := buf[p : p+4096]
		n := uint64(off+int64(p)) / 4096
		switch n % 4 {
		case 0:
			clear(page)
		case 1:
			for i := 0; i < len(page); i += 8 {
				binary.LittleEndian.PutUint64(page[i:], n*0x9e3779b97f4a7c15)
			}
		case 2:
			for i := 0; i < len(page); i += 16 {
				binary.LittleEndian.PutUint64(page[i:], n)
				binary.LittleEndian.PutUint64(page[i+8:], uint64(i))
			}
		case 3:
			r := rand.NewPCG(n, 0x677a72616d64)
			for i := 0; i < len(page); i += 8 {
				binary.LittleEndian.PutUint64(page[i:], r.Uint64())
			}
		}
	}
}
