package serving

import "testing"

// --realtime auto asks for real-time priority exactly when gzramd attaches
// the kernel device, which it then serves as swap.
func TestWantRealtime(t *testing.T) {
	for _, tc := range []struct {
		realtime, device string
		swap, want       bool
	}{
		{"auto", "", false, false},
		{"auto", "/dev/nbd0", false, true},
		{"auto", "auto", false, true},
		{"auto", "", true, true},
		{"on", "", false, true},
		{"off", "/dev/nbd0", true, false},
	} {
		c := Config{Realtime: tc.realtime, Device: tc.device, Swap: tc.swap}
		if got := c.WantRealtime(); got != tc.want {
			t.Errorf("--realtime %s --device %q --swap=%v: real-time %v, want %v", tc.realtime, tc.device, tc.swap, got, tc.want)
		}
	}
}

func TestInlineHelpers(t *testing.T) {
	for _, tc := range []struct{ flag, cpus, want int }{
		{-1, 1, 0}, {-1, 2, 0}, {-1, 4, 0}, {-1, 8, 1}, {-1, 16, 3}, {-1, 128, 3},
		{0, 16, 0}, {5, 2, 5},
	} {
		c := Config{NBDInlineHelpers: tc.flag}
		if got := inlineHelpers(&c, tc.cpus); got != tc.want {
			t.Errorf("--nbd-inline-helpers %d on %d CPUs: %d helpers, want %d", tc.flag, tc.cpus, got, tc.want)
		}
	}
}
