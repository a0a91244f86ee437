//go:build gpu

package device

import (
	"log/slog"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/gpu"
)

// TestCorpusAgingOnGPU ages the shared corpus on the CPU and on a GPU
// (its LZ4 backend) in one run: the ratio after aging, what the GPU's
// frames store beside the CPU's, and the CPU it costs per GB recompressed
// (issue 24: at most 1.0 CPU-s per GB on the GPU).
func TestCorpusAgingOnGPU(t *testing.T) {
	data := testneeds.Corpus(t)
	g, err := gpu.Open(gpu.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cpu := ageCorpus(t, "CPU recompression", data, 1, nil)
	onGPU := ageCorpus(t, "GPU recompression", data, 1, func(d *Device) {
		if err := d.SetDenseGPU(g); err != nil {
			t.Fatal(err)
		}
	})
	gb := func(r aged) float64 { return float64(r.st.Dense.Pages) * pageSize / 1e9 }
	t.Logf("GPU against CPU: ratio after aging %.3f against %.3f (%.3fx); process CPU %.2f against %.2f CPU-s per GB recompressed",
		onGPU.after, cpu.after, onGPU.after/cpu.after, onGPU.cpu.Seconds()/gb(onGPU), cpu.cpu.Seconds()/gb(cpu))
	if onGPU.st.Dense.OnGPU == 0 {
		t.Fatal("no group was recompressed on the GPU")
	}
}
