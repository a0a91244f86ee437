package pipeline

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/route/routetest"
)

// TestRoundTrip builds each kind of data path and writes, reads back and
// closes it.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		staged bool
	}{
		{"cpu", Config{}, false},
		{"accelerated", Config{Accelerator: routetest.NewAccelerator(), StagingBytes: 4 << 20, BatchPages: 64, BatchWorkers: 2}, true},
		{"accelerator without staging", Config{Accelerator: routetest.NewAccelerator()}, false},
		{"zstd", Config{Algorithm: "zstd"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Size = 8 << 20
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			data := make([]byte, 4<<20)
			for i := range data {
				data[i] = byte(i/512) ^ byte(r.IntN(4)) // compressible, not same-filled
			}
			ctx := context.Background()
			if err := p.Device.WriteAt(ctx, data, 0, false); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(data))
			if err := p.Device.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
			}
			if err := p.Device.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			st, rs := p.Device.Stats(), p.Router.Stats()
			if staged := st.StagedWrites > 0; staged != tc.staged {
				t.Fatalf("staged %d pages; want staging %v", st.StagedWrites, tc.staged)
			}
			if tc.staged && rs.AcceleratorPages == 0 {
				t.Fatalf("staged writes never reached the accelerator: %+v", rs)
			}
			if st.MemUsedTotal == 0 || st.MemUsedTotal >= int64(len(data)) {
				t.Fatalf("mem_used %d for %d bytes of compressible pages", st.MemUsedTotal, len(data))
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestStagingTooSmall(t *testing.T) {
	_, err := New(Config{Size: 1 << 20, Accelerator: routetest.NewAccelerator(), StagingBytes: 1 << 20, BatchPages: 256, BatchWorkers: 8})
	if err == nil {
		t.Fatal("1 MiB of staging accepted for 8 workers of 1 MiB batches")
	}
}

// TestStagingWaitByAlgorithm: a zstd write waits for staging by default
// (its CPU codec costs far more than the accelerator), an LZ4 write does
// not, and StagingWait overrides both ways.
func TestStagingWaitByAlgorithm(t *testing.T) {
	for _, c := range []struct {
		algorithm string
		wait      time.Duration
		want      time.Duration
	}{
		{"zstd", 0, DefaultStagingWaitZstd},
		{"lz4", 0, 0},
		{"zstd", -1, 0},
		{"lz4", 3 * time.Millisecond, 3 * time.Millisecond},
	} {
		cfg := Config{Algorithm: c.algorithm, StagingWait: c.wait, Accelerator: routetest.NewAccelerator(), StagingBytes: 4 << 20, BatchPages: 64, BatchWorkers: 2}
		sc, err := stagingConfig(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Wait != c.want {
			t.Errorf("%s with StagingWait %v: staging waits %v, want %v", c.algorithm, c.wait, sc.Wait, c.want)
		}
	}
}
