package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// TestHandOverMidStream: a client keeps 32 requests in flight (writes of
// fresh blocks, reads of blocks written before) while its server hands the
// connection over and another server adopts it; the client sees every
// reply, in step, and never a disconnect.
func TestHandOverMidStream(t *testing.T) {
	const block, blocks = 4096, 1024
	mem := nbdtest.NewMemBackend(block * blocks)
	exports := []Export{{Name: "h", Backend: mem}}
	a := startServer(t, exports, Options{})
	nc, _, err := Dial(context.Background(), "unix", a.sock, "h")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	type sent struct {
		read  bool
		block int
	}
	var mu sync.Mutex
	inflight := map[uint64]sent{}
	want := make([][]byte, blocks) // acknowledged contents
	acked := make([]bool, blocks)
	window := make(chan struct{}, 32)
	const total = 6000
	errc := make(chan error, 2)
	replies := make(chan struct{})

	content := func(i int) []byte {
		b := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0xa5, byte(i * 7)}, block/4)
		return b
	}
	// The receiver: simple replies, a read's payload after its header.
	go func() {
		defer close(replies)
		var h [replyHeaderLen]byte
		buf := make([]byte, block)
		for n := 0; n < total; n++ {
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				errc <- err
				return
			}
			if binary.BigEndian.Uint32(h[0:]) != magicReply || binary.BigEndian.Uint32(h[4:]) != 0 {
				errc <- io.ErrUnexpectedEOF
				return
			}
			cookie := binary.BigEndian.Uint64(h[8:])
			mu.Lock()
			s := inflight[cookie]
			delete(inflight, cookie)
			mu.Unlock()
			if s.read {
				if _, err := io.ReadFull(nc, buf); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				w := want[s.block]
				mu.Unlock()
				if !bytes.Equal(buf, w) {
					t.Errorf("read of block %d: wrong data", s.block)
				}
			} else {
				mu.Lock()
				want[s.block] = content(s.block)
				acked[s.block] = true
				mu.Unlock()
			}
			<-window
		}
	}()
	// The sender.
	var b *Server
	go func() {
		req := make([]byte, requestHeaderLen+block)
		next := 0
		for n := 0; n < total; n++ {
			window <- struct{}{}
			mu.Lock()
			s := sent{block: next % blocks}
			if n%3 == 2 && next > 64 {
				// A read of a block acknowledged long ago.
				for s.block = (next - 64) % blocks; !acked[s.block]; s.block = (s.block + 1) % blocks {
				}
				s.read = true
			}
			inflight[uint64(n)] = s
			mu.Unlock()
			binary.BigEndian.PutUint32(req[0:], magicRequest)
			binary.BigEndian.PutUint16(req[4:], 0)
			binary.BigEndian.PutUint64(req[8:], uint64(n))
			binary.BigEndian.PutUint64(req[16:], uint64(s.block*block))
			binary.BigEndian.PutUint32(req[24:], block)
			m := requestHeaderLen
			if s.read {
				binary.BigEndian.PutUint16(req[6:], uint16(CmdRead))
			} else {
				binary.BigEndian.PutUint16(req[6:], uint16(CmdWrite))
				copy(req[requestHeaderLen:], content(s.block))
				m += block
				next++
			}
			if _, err := nc.Write(req[:m]); err != nil {
				errc <- err
				return
			}
		}
	}()

	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	handed, err := a.srv.HandOver(ctx)
	if err != nil || len(handed) != 1 {
		t.Fatalf("HandOver: %d connections, %v", len(handed), err)
	}
	t.Logf("handed over with %d bytes read beyond the boundary", len(handed[0].Pending))
	bopts := Options{Logger: quietLogger(t), Inline: inlineTests}
	if inlineHelperTests {
		bopts.InlineHelpers = 3
	}
	b, err = NewServer(exports, bopts)
	if err != nil {
		t.Fatal(err)
	}
	nc2, err := net.FileConn(handed[0].File)
	handed[0].File.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Adopt(nc2, handed[0].Export, handed[0].Pending); err != nil {
		t.Fatal(err)
	}
	select {
	case <-replies:
	case err := <-errc:
		t.Fatalf("the client saw %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("replies stopped after the handover")
	}
	select {
	case err := <-errc:
		t.Fatalf("the client saw %v", err)
	default:
	}
	snap := mem.Snapshot()
	for i, w := range want {
		if w != nil && !bytes.Equal(snap[i*block:(i+1)*block], w) {
			t.Fatalf("block %d differs after the handover", i)
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	nc.Close()
	if err := b.Shutdown(sctx); err != nil {
		t.Error(err)
	}
}
