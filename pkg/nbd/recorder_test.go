package nbd

import (
	"slices"
	"sync"
	"testing"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

type recorded struct {
	cmd    Command
	off    uint64
	length uint32
}

// listRecorder keeps every request it is told about.
type listRecorder struct {
	mu   sync.Mutex
	reqs []recorded
}

func (r *listRecorder) RecordRequest(cmd Command, off uint64, length uint32) {
	r.mu.Lock()
	r.reqs = append(r.reqs, recorded{cmd, off, length})
	r.mu.Unlock()
}

// The Recorder sees each valid request with its own offset and length,
// in the order the connection sent them, and none of the invalid ones.
func TestRecorder(t *testing.T) {
	rec := &listRecorder{}
	const size = 1 << 20
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(size)}}, Options{Recorder: rec})
	c := dialRaw(t, ts, "d")
	c.expect(0, CmdWrite, 0, 8192, 4096, make([]byte, 4096))
	c.expect(0, CmdRead, 0, 4096, 12288, nil)
	c.expect(0, CmdFlush, 0, 0, 0, nil)
	c.expect(0, CmdTrim, 0, 65536, 131072, nil)
	c.expect(0, CmdWriteZeroes, cmdFlagNoHole, 3<<16, 1<<16, nil)
	c.expect(0, CmdRead, 0, 0, 0, nil) // valid, if pointless
	c.expect(errnoInval, CmdRead, 0, size, 4096, nil)
	c.expect(errnoNoSpc, CmdWrite, 0, size-1, 2, []byte{1, 2})
	c.expect(errnoInval, CmdWrite, 0, 0, MaxPayload+1, make([]byte, MaxPayload+1))
	c.expect(errnoInval, CmdCache, 0, 0, 4096, nil)
	c.expect(errnoInval, Command(99), 0, 0, 4096, nil)
	c.expect(0, CmdWrite, 0, size-512, 512, make([]byte, 512))
	c.send(CmdDisc, 0, 1, 0, 0, nil)
	expectClosed(t, c.nc)
	ts.shutdown(t)

	want := []recorded{
		{CmdWrite, 8192, 4096},
		{CmdRead, 4096, 12288},
		{CmdFlush, 0, 0},
		{CmdTrim, 65536, 131072},
		{CmdWriteZeroes, 3 << 16, 1 << 16},
		{CmdRead, 0, 0},
		{CmdWrite, size - 512, 512},
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !slices.Equal(rec.reqs, want) {
		t.Errorf("recorded\n%v\nwant\n%v", rec.reqs, want)
	}
}
