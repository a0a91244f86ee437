package ublk

import (
	"context"
	"sync"
)

// memBackend is a Backend in memory, counting its calls.
type memBackend struct {
	mu      sync.Mutex
	data    []byte
	flushes int
	trims   int
	zeroes  int
	fuas    int
	noHoles int
	failAt  int64 // a read or write touching this offset fails (with failErr), -1 none
	failErr error
}

func newMemBackend(size int64) *memBackend {
	return &memBackend{data: make([]byte, size), failAt: -1}
}

func (m *memBackend) Size() int64 { return int64(len(m.data)) }

func (m *memBackend) fails(off, n int64) bool {
	return m.failAt >= off && m.failAt < off+n
}

func (m *memBackend) ReadAt(_ context.Context, p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fails(off, int64(len(p))) {
		return m.failErr
	}
	copy(p, m.data[off:])
	return nil
}

func (m *memBackend) WriteAt(_ context.Context, p []byte, off int64, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fails(off, int64(len(p))) {
		return m.failErr
	}
	if fua {
		m.fuas++
	}
	copy(m.data[off:], p)
	return nil
}

func (m *memBackend) Trim(_ context.Context, off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trims++
	clear(m.data[off : off+length])
	return nil
}

func (m *memBackend) WriteZeroes(_ context.Context, off, length int64, noHole bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.zeroes++
	if noHole {
		m.noHoles++
	}
	clear(m.data[off : off+length])
	return nil
}

func (m *memBackend) Flush(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flushes++
	return nil
}
