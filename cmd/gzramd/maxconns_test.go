package main

import (
	"strings"
	"testing"

	"github.com/gzramd/gzramd/pkg/serving"
)

// --max-connections defaults to a limit, takes 0 for none, and refuses a
// negative count with a line naming the flag.
func TestMaxConnectionsFlag(t *testing.T) {
	cfg := &serving.Config{}
	cmd := serveCmd(cfg)
	if cfg.MaxConns != 8 {
		t.Errorf("--max-connections defaults to %d, want 8", cfg.MaxConns)
	}
	for _, tc := range []struct {
		value string
		err   string
	}{
		{"0", ""},
		{"64", ""},
		{"-1", "invalid --max-connections -1"},
	} {
		if err := cmd.Flags().Set("max-connections", tc.value); err != nil {
			t.Fatal(err)
		}
		c := *cfg
		c.Size, c.Socket, c.Staging = 1<<30, "/tmp/x.sock", 0
		c.NBDInline, c.Realtime, c.Backend, c.Algorithm, c.LogLevel = "auto", "auto", "cpu", "lz4", "info"
		c.BatchPages, c.BatchDeadline, c.BatchInFlight, c.HugeThreshold, c.ObjectPages = 256, 1e6, 8, 3000, 1
		c.DenseCPU, c.GPUMinPages, c.KernelConns, c.NBDInlineHelpers = 0.1, 16, 1, -1
		err := validate(&c)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("--max-connections %s: %v", tc.value, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("--max-connections %s: %v, want %q", tc.value, err, tc.err)
		}
	}
}
