package metrics

import (
	"fmt"
	"testing"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// Connections are counted by client: the kernel's, each TLS client
// name up to MaxClientLabels, and the rest as "other", a name that
// claims to be the kernel among them.
func TestConnectionsByClient(t *testing.T) {
	var open []nbd.ConnInfo
	m := NewConnections(func() []nbd.ConnInfo { return open })
	get := scraper(t, m)

	f, body := get()
	want(t, f, "gzramd_nbd_connections", 0, "client", "kernel")
	want(t, f, "gzramd_nbd_connections", 0, "client", "other")
	promtoolCheck(t, body)

	open = []nbd.ConnInfo{
		{Transport: "unix", Own: true}, {Transport: "unix", Own: true},
		{Transport: "tcp"}, {Transport: "unix", PeerPID: 7},
		{Transport: "tcp", TLS: true, Client: "alice"}, {Transport: "tcp", TLS: true, Client: "alice"},
		{Transport: "tcp", TLS: true, Client: "kernel"},
		{Transport: "tcp", TLS: true}, // still in its handshake
	}
	for i := range MaxClientLabels + 4 {
		open = append(open, nbd.ConnInfo{Transport: "tcp", TLS: true, Client: fmt.Sprintf("host%02d", i)})
	}
	f, _ = get()
	want(t, f, "gzramd_nbd_connections", 2, "client", "kernel")
	want(t, f, "gzramd_nbd_connections", 2, "client", "alice")
	// tcp, unix, "kernel" by name, the handshake, and the 5 names past the
	// first 16 (alice and host00-host14).
	want(t, f, "gzramd_nbd_connections", 4+5, "client", "other")
	want(t, f, "gzramd_nbd_connections", 1, "client", "host14")
	if _, ok := f.Value("gzramd_nbd_connections", "client", "host15"); ok {
		t.Error("a 17th client name got a label value of its own")
	}

	// Names that had a label keep it, at 0 once their connections close.
	open = open[:1]
	f, _ = get()
	want(t, f, "gzramd_nbd_connections", 1, "client", "kernel")
	want(t, f, "gzramd_nbd_connections", 0, "client", "alice")
	want(t, f, "gzramd_nbd_connections", 0, "client", "other")
	if n := len(f["gzramd_nbd_connections"].GetMetric()); n != MaxClientLabels+2 {
		t.Errorf("%d series, want %d: kernel, other and %d names", n, MaxClientLabels+2, MaxClientLabels)
	}
}
