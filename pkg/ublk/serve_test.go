package ublk

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestServeNoDriver(t *testing.T) {
	err := Serve(context.Background(), Config{ControlPath: filepath.Join(t.TempDir(), "ublk-control")}, newMemBackend(1<<20))
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Serve without a control device: %v, want ErrNoDriver", err)
	}
	if !strings.Contains(err.Error(), "modprobe ublk_drv") {
		t.Errorf("the error does not say what to do: %v", err)
	}
}

func TestServeBadConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		size int64
	}{
		{"depth too large", Config{Depth: MaxQueueDepth + 1}, 1 << 20},
		{"negative queues", Config{Queues: -1}, 1 << 20},
		{"requests not of whole blocks", Config{MaxIOBytes: 6000}, 1 << 20},
		{"requests too large", Config{MaxIOBytes: 2 * MaxIOBytes}, 1 << 20},
		{"size not of whole blocks", Config{}, 1<<20 + 512},
	} {
		// A control path that does not exist: the config must be refused
		// before it is looked for.
		c.cfg.ControlPath = filepath.Join(t.TempDir(), "none")
		err := Serve(context.Background(), c.cfg, newMemBackend(c.size))
		if err == nil || errors.Is(err, ErrNoDriver) {
			t.Errorf("%s: %v, want the config refused", c.name, err)
		}
	}
}
