package serving

import (
	"errors"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/pkg/gpu"
)

// --backend auto serves small devices on the CPU, where the GPU's own
// memory would not pay; gpu and cpu are taken at their word.
func TestResolveBackend(t *testing.T) {
	for _, c := range []struct {
		backend string
		size    Size
		staging Size
		want    string
		why     bool
	}{
		{"auto", 8 << 30, 16 << 20, "auto", false},
		{"auto", 64 << 30, 16 << 20, "auto", false},
		{"auto", 8<<30 - 4096, 16 << 20, "cpu", true},
		{"auto", 1 << 30, 16 << 20, "cpu", true},
		{"auto", 8 << 30, 0, "cpu", true},
		{"gpu", 1 << 30, 16 << 20, "gpu", false},
		{"cpu", 64 << 30, 16 << 20, "cpu", false},
	} {
		cfg := &Config{Backend: c.backend, Size: c.size, Staging: c.staging}
		got, why := cfg.ResolveBackend()
		if got != c.want || (why != "") != c.why {
			t.Errorf("--backend %s --size %s --staging %s: %q (%q), want %q", c.backend, c.size.String(), c.staging.String(), got, why, c.want)
		}
	}
}

// TestOpenBackend: --backend's policy, written once for serve and bench:
// cpu opens nothing, gpu must open one, auto takes one where open works
// and says why not otherwise.
func TestOpenBackend(t *testing.T) {
	refused := errors.New("no GPU here")
	for _, tc := range []struct {
		backend      string
		fails        bool
		opened, err  bool
		unused, asks bool
	}{
		{backend: "cpu"},
		{backend: "auto", asks: true, opened: true},
		{backend: "auto", fails: true, asks: true, unused: true},
		{backend: "gpu", asks: true, opened: true},
		{backend: "gpu", fails: true, asks: true, err: true},
	} {
		asked := false
		g, unused, err := OpenBackend("--backend", tc.backend, func() (*gpu.Backend, error) {
			asked = true
			if tc.fails {
				return nil, refused
			}
			return &gpu.Backend{}, nil
		})
		if asked != tc.asks || (g != nil) != tc.opened || (unused != nil) != tc.unused || (err != nil) != tc.err {
			t.Errorf("%s, open fails %v: asked %v, opened %v, unused %v, err %v", tc.backend, tc.fails, asked, g != nil, unused, err)
		}
		if err != nil && (!errors.Is(err, refused) || !strings.Contains(err.Error(), "--backend gpu")) {
			t.Errorf("%s: error %q does not name the flag or wrap the cause", tc.backend, err)
		}
	}
}
