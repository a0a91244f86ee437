package pipeline

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/route/routetest"
)

// TestServedThroughStaging serves a data path with staging over NBD and
// copies pages in and out with a real client (libnbd's nbdcopy): the
// server receives write payloads straight into staging slots, same-filled
// pages among them included.
func TestServedThroughStaging(t *testing.T) {
	nbdcopy := testneeds.Command(t, "nbdcopy", "libnbd-bin")
	p, err := New(Config{Size: 64 << 20, Accelerator: routetest.NewAccelerator(), StagingBytes: 8 << 20,
		BatchPages: 64, BatchWorkers: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	srv, err := nbd.NewServer([]nbd.Export{{Name: "gz", Backend: p.Device}}, nbd.Options{Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()

	r := rand.New(rand.NewPCG(4, 4))
	data := make([]byte, 32<<20)
	for pg := 0; pg < len(data)/4096; pg++ {
		page := data[pg*4096 : (pg+1)*4096]
		switch pg % 7 {
		case 0: // same-filled, not zero
			for i := range page {
				page[i] = 0xab
			}
		case 1:
			for i := range page {
				page[i] = byte(r.Uint32())
			}
		default:
			for i := range page {
				page[i] = byte(pg) + byte(i/64)
			}
		}
	}
	src := filepath.Join(dir, "in")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	uri := "nbd+unix:///gz?socket=" + sock
	if out, err := exec.Command(nbdcopy, "--request-size=131072", src, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v\n%s", err, out)
	}
	back := filepath.Join(dir, "out")
	if out, err := exec.Command(nbdcopy, uri, back).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out: %v\n%s", err, out)
	}
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:len(data)], data) {
		t.Fatal("pages read back differ from the pages written")
	}
	if err := p.Device.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := p.Device.Stats()
	if st.StagedWrites == 0 || st.UnusedSlots == 0 || st.SamePages == 0 {
		t.Fatalf("stats %+v: want pages received into staging, same-filled ones among them", st)
	}
	t.Logf("staged %d pages, %d slots unused (same-filled on arrival), router %+v", st.StagedWrites, st.UnusedSlots, p.Router.Stats())
}
