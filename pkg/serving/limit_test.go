package serving

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// The kernel device's connections are the ones this process dialed, or
// those handed over as the kernel's: never counted against
// --max-connections. Anything else is.
func TestOwnConnections(t *testing.T) {
	d := &daemon{}
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tl := d.tracker.Wrap(l)
	dialed, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := tl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	if !d.ownConn(accepted) {
		t.Error("a connection this process dialed over the Unix socket is not its own")
	}

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if !d.ownConn(d.tracker.Track(a, os.Getpid())) {
		t.Error("a connection handed over as the kernel's is not own")
	}
	if d.ownConn(d.tracker.Track(b, 0)) {
		t.Error("a connection handed over as another client's is own")
	}
	if d.ownConn(a) {
		t.Error("an untracked connection is own")
	}
}

func TestMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want int
	}{
		{Config{MaxConns: 8, KernelConns: 4, Socket: "/s"}, 8},
		{Config{MaxConns: 8, KernelConns: 4, Socket: "/s", Device: "auto"}, 8},
		// Over TCP the kernel's connections count: room is made for them.
		{Config{MaxConns: 8, KernelConns: 4, TCP: ":1", Device: "auto"}, 12},
		{Config{MaxConns: 0, KernelConns: 4, TCP: ":1", Device: "auto"}, 0},
	} {
		if got := maxConnections(&tc.cfg); got != tc.want {
			t.Errorf("maxConnections(%+v) = %d, want %d", tc.cfg, got, tc.want)
		}
	}
}
