package nbd

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// BenchmarkRequests drives the server over a unix socket with a pipelined
// raw client (itself allocation-free) at queue depth 1 and 32, 4 KiB
// requests at scattered offsets. allocs/op counts both sides; in steady
// state it should be ~0.
func BenchmarkRequests(b *testing.B) {
	for _, cmd := range []Command{CmdRead, CmdWrite} {
		for _, qd := range []int{1, 32} {
			b.Run(fmt.Sprintf("%v/4KiB/qd%d", cmd, qd), func(b *testing.B) {
				benchRequests(b, cmd, 4096, qd, nil)
			})
		}
	}
	// With an Observer, as the daemon runs it (atomic counters).
	b.Run("write/4KiB/qd32/observer", func(b *testing.B) {
		benchRequests(b, CmdWrite, 4096, 32, &atomicObserver{})
	})
}

type atomicObserver struct{ n, bytes, nanos atomic.Uint64 }

func (o *atomicObserver) RequestDone(cmd Command, length uint32, d time.Duration, errno uint32) {
	o.n.Add(1)
	o.bytes.Add(uint64(length))
	o.nanos.Add(uint64(d))
}

func benchRequests(b *testing.B, cmd Command, size uint32, qd int, obs Observer) {
	const devSize = 64 << 20
	mem := nbdtest.NewMemBackend(devSize)
	ts := startServer(b, []Export{{Name: "d", Backend: mem}}, Options{Observer: obs})
	nc, _, err := Dial(context.Background(), "unix", ts.sock, "d")
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	driveRequests(b, nc, cmd, size, qd, devSize)
}

// driveRequests sends b.N requests of cmd, size bytes each, at scattered
// offsets of a device of devSize, with up to qd in flight on nc, a
// connection in the transmission phase.
func driveRequests(b *testing.B, nc net.Conn, cmd Command, size uint32, qd int, devSize uint64) {
	pages := devSize / uint64(size)
	tokens := make(chan struct{}, qd)
	done := make(chan error, 1)
	go func() {
		var h [replyHeaderLen]byte
		data := make([]byte, size)
		for i := 0; i < b.N; i++ {
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				done <- err
				return
			}
			if be.Uint32(h[4:]) != 0 {
				done <- fmt.Errorf("errno %d", be.Uint32(h[4:]))
				return
			}
			if cmd == CmdRead {
				if _, err := io.ReadFull(nc, data); err != nil {
					done <- err
					return
				}
			}
			<-tokens
		}
		done <- nil
	}()

	req := make([]byte, requestHeaderLen+int(size))
	be.PutUint32(req[0:], magicRequest)
	be.PutUint16(req[6:], uint16(cmd))
	be.PutUint32(req[24:], size)
	msg := req[:requestHeaderLen]
	if cmd == CmdWrite {
		msg = req
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tokens <- struct{}{}
		be.PutUint64(req[8:], uint64(i))
		be.PutUint64(req[16:], (uint64(i)*7919%pages)*uint64(size))
		if _, err := nc.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}
