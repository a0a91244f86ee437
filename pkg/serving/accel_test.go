package serving

import "testing"

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
