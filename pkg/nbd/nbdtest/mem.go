package nbdtest

import (
	"context"
	"sync"
)

// MemBackend is an in-memory device for a server in tests: it has the
// methods of blockdev.Backend.
type MemBackend struct {
	mu      sync.RWMutex
	data    []byte
	flushes int
	// Hook, if set, runs at the start of every call, with the call's name
	// (read, write, trim, zero, flush) and offset, and its error is the
	// call's: to inject faults. Set it before the server runs.
	Hook func(op string, off int64) error
}

// NewMemBackend returns a zeroed device of size bytes.
func NewMemBackend(size int) *MemBackend { return &MemBackend{data: make([]byte, size)} }

func (m *MemBackend) Size() int64 { return int64(len(m.data)) }

func (m *MemBackend) call(op string, off int64) error {
	if m.Hook != nil {
		return m.Hook(op, off)
	}
	return nil
}

func (m *MemBackend) ReadAt(_ context.Context, p []byte, off int64) error {
	if err := m.call("read", off); err != nil {
		return err
	}
	m.mu.RLock()
	copy(p, m.data[off:])
	m.mu.RUnlock()
	return nil
}

func (m *MemBackend) WriteAt(_ context.Context, p []byte, off int64, fua bool) error {
	if err := m.call("write", off); err != nil {
		return err
	}
	m.mu.Lock()
	copy(m.data[off:], p)
	m.mu.Unlock()
	return nil
}

func (m *MemBackend) zero(off, length int64) {
	m.mu.Lock()
	clear(m.data[off : off+length])
	m.mu.Unlock()
}

func (m *MemBackend) Trim(_ context.Context, off, length int64) error {
	if err := m.call("trim", off); err != nil {
		return err
	}
	m.zero(off, length)
	return nil
}

func (m *MemBackend) WriteZeroes(_ context.Context, off, length int64, noHole bool) error {
	if err := m.call("zero", off); err != nil {
		return err
	}
	m.zero(off, length)
	return nil
}

func (m *MemBackend) Flush(context.Context) error {
	if err := m.call("flush", 0); err != nil {
		return err
	}
	m.mu.Lock()
	m.flushes++
	m.mu.Unlock()
	return nil
}

// Flushes counts the flushes served.
func (m *MemBackend) Flushes() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.flushes
}

// Snapshot returns a copy of the device's bytes.
func (m *MemBackend) Snapshot() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]byte(nil), m.data...)
}

// Bytes is the device's memory itself: to fill or fault in before a
// server serves it, not after.
func (m *MemBackend) Bytes() []byte { return m.data }
