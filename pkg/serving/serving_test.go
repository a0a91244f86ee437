package serving

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/sdnotify"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/supervise"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

func TestMain(m *testing.M) {
	if os.Getenv("SERVING_TEST_ORPHAN") != "" {
		os.Exit(orphanChild())
	}
	os.Exit(m.Run())
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestHandedConnRoundTrip: what a handover carries for a connection comes
// out as it went in, and a message that is not one is refused.
func TestHandedConnRoundTrip(t *testing.T) {
	for _, h := range []handedConn{
		{},
		{kernel: true, export: "gzram0"},
		{export: "x", pending: []byte{0x25, 0x60, 0x95, 0x13, 0, 1}},
		{kernel: true, export: strings.Repeat("e", 255), pending: bytes.Repeat([]byte{7}, 128<<10)},
	} {
		got, err := decodeHanded(h.encode())
		if err != nil || got.kernel != h.kernel || got.export != h.export || !bytes.Equal(got.pending, h.pending) {
			t.Errorf("round trip of %+v: %+v, %v", h, got, err)
		}
	}
	for _, b := range [][]byte{nil, {0}, {2, 0}, {0, 5, 'a'}} {
		if _, err := decodeHanded(b); err == nil {
			t.Errorf("decodeHanded(%q) accepted", b)
		}
	}
}

// TestStopPolicy: a stop goes ahead when the export is no active swap;
// swap on the export that gzramd did not turn on blocks it, unless
// --force.
func TestStopPolicy(t *testing.T) {
	dir := t.TempDir()
	swaps := filepath.Join(dir, "swaps")
	sys := filepath.Join(dir, "block")
	if err := os.MkdirAll(filepath.Join(sys, "nbd3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "nbd3", "pid"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, c := range []struct {
		name  string
		swaps string
		force bool
		want  bool
	}{
		{"no swap", "Filename Type Size Used Priority\n", false, true},
		{"another device's swap", "Filename Type Size Used Priority\n/dev/sda2 partition 1024 0 -2\n", false, true},
		{"the export is swap", "Filename Type Size Used Priority\n/dev/nbd3 partition 1048572 2048 100\n", false, false},
		{"the export is swap, --force", "Filename Type Size Used Priority\n/dev/nbd3 partition 1048572 2048 100\n", true, true},
	} {
		if err := os.WriteFile(swaps, []byte(c.swaps), 0o644); err != nil {
			t.Fatal(err)
		}
		d := &daemon{cfg: &Config{Force: c.force}, log: quiet(), notify: sdnotify.New(""),
			host: swapctl.Host{ProcSwaps: swaps, SysBlock: sys}}
		d.tracker.Track(a, 4242) // the process that attached nbd3 is connected
		if got := d.readyToStop(context.Background()); got != c.want {
			t.Errorf("%s: ready to stop %v, want %v", c.name, got, c.want)
		}
	}
}

// TestOrphanRendezvous: a serving process whose supervisor died (here a
// child of the test, on the same state) hands its connections to the
// next one that asks on the state's rendezvous socket, and exits; the
// next one gets them only once it has.
func TestOrphanRendezvous(t *testing.T) {
	st, err := pipeline.NewState("serving-test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Info(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SERVING_TEST_ORPHAN=1")
	for _, f := range st.Files() {
		cmd.ExtraFiles = append(cmd.ExtraFiles, f.OSFile())
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := make([]byte, 9)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "listening" {
		t.Fatalf("the orphan said %q, %v", line, err)
	}
	msgs, err := takeFromOrphan(st, supervise.Started{Serving: true}, quiet())
	if err != nil {
		testneeds.Machine(t, "abstract unix sockets of type SOCK_SEQPACKET: %v", err)
	}
	if len(msgs) != 1 || string(msgs[0].Data) != "a connection" {
		t.Fatalf("handed over %d messages, want the one", len(msgs))
	}
	if !exited(cmd.Process.Pid) {
		t.Fatal("took the connections before the orphan exited")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the orphan: %v", err)
	}
}

// orphanChild plays the orphan: it listens on the rendezvous of the state
// at descriptors 3 on, says so, hands over one message to the next that
// asks, and exits.
func orphanChild() int {
	files, err := supervise.Started{}.Files(pipeline.StateFileNames)
	if err != nil {
		return 3
	}
	st, err := pipeline.StateFrom(files)
	if err != nil {
		return 4
	}
	d := &daemon{log: quiet(), successor: make(chan *os.File, 1)}
	d.listenForSuccessor(st)
	os.Stdout.WriteString("listening")
	select {
	case f := <-d.successor:
		if supervise.Send(f, supervise.Message{Data: []byte("a connection")}) != nil || supervise.SendEnd(f) != nil {
			return 5
		}
		return 0
	case <-time.After(30 * time.Second):
		return 6
	}
}
