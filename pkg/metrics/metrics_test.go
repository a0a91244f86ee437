package metrics

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/route/routetest"
	"github.com/gzramd/gzramd/pkg/ublk"
)

const pageSize = codec.PageSize

// stack is a real data path whose writes are staged for an accelerator (a
// fake one that compresses on the CPU), observed by the collectors.
type stack struct {
	pipe    *pipeline.Pipeline
	dev     *device.Device
	nbd     *NBD
	batches *Batches
	get     func() (Families, []byte)
}

func newStack(t *testing.T, size int64) *stack {
	t.Helper()
	s := &stack{nbd: NewNBD(), batches: NewBatches()}
	var err error
	s.pipe, err = pipeline.New(pipeline.Config{
		Size: size, Accelerator: routetest.NewAccelerator(), MinAcceleratorPages: 4,
		StagingBytes: 1 << 20, BatchPages: 32, BatchWorkers: 2, Observer: s.batches,
		// Long enough for a scrape to see a page staged.
		BatchDeadline: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.dev = s.pipe.Device
	t.Cleanup(func() { s.pipe.Close() })
	s.get = scraper(t, s.nbd, s.batches, NewDevice(Info{
		Version: "test", Export: "gzram0", Algorithm: "lz4", Backend: "gpu", DiskSize: size,
	}, s.dev.Stats, s.pipe.Router.Stats))
	return s
}

func (s *stack) scrape(t *testing.T) (Families, []byte) {
	t.Helper()
	return s.get()
}

// testPages returns n pages: zero-filled, same-filled, text-like and random,
// so every kind of entry shows in the statistics.
func testPages(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, n*pageSize)
	for i := range n {
		p := buf[i*pageSize : (i+1)*pageSize]
		switch i % 4 {
		case 1:
			for j := range p {
				p[j] = 0xAB
			}
		case 2:
			for j := range p {
				p[j] = "gzramd compresses pages "[(j+i)%24]
			}
			p[i%pageSize] = byte(i)
		case 3:
			for j := range p {
				p[j] = byte(r.Uint32())
			}
		}
	}
	return buf
}

func want(t *testing.T, f Families, name string, v float64, labels ...string) {
	t.Helper()
	got, ok := f.Value(name, labels...)
	if !ok {
		t.Errorf("%s%v missing from the scrape", name, labels)
		return
	}
	if got != v {
		t.Errorf("%s%v = %v, want %v", name, labels, got, v)
	}
}

func TestScrapeMatchesDevice(t *testing.T) {
	const pages = 256
	s := newStack(t, 64<<20)
	ctx := context.Background()
	data := testPages(pages)
	for i := 0; i < pages; i += 16 {
		if err := s.dev.WriteAt(ctx, data[i*pageSize:(i+16)*pageSize], int64(i)*pageSize, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.dev.Trim(ctx, 0, 8*pageSize); err != nil {
		t.Fatal(err)
	}
	// An out-of-range request counts as invalid I/O.
	if err := s.dev.ReadAt(ctx, make([]byte, pageSize), 64<<20); err == nil {
		t.Fatal("read past the end succeeded")
	}

	// One more write, staged and left uncompressed while scraped: staged
	// pages count as raw pages until their batch is stored.
	if err := s.dev.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.dev.WriteAt(ctx, data[2*pageSize:3*pageSize], int64(pages)*pageSize, false); err != nil {
		t.Fatal(err)
	}
	f, _ := s.scrape(t)
	want(t, f, "gzramd_staged_pages", 1)
	if err := s.dev.Drain(ctx); err != nil {
		t.Fatal(err)
	}

	f, body := s.scrape(t)
	st := s.dev.Stats()
	if st.StoredPages == 0 || st.SamePages == 0 || st.NotifyFree == 0 || st.StagedWrites == 0 {
		t.Fatalf("the test wrote too little to check anything: %+v", st)
	}
	want(t, f, "gzramd_orig_data_bytes", float64(st.OrigDataSize))
	want(t, f, "gzramd_compr_data_bytes", float64(st.ComprDataSize))
	want(t, f, "gzramd_mem_used_bytes", float64(st.MemUsedTotal))
	want(t, f, "gzramd_mem_used_max_bytes", float64(st.MemUsedMax))
	want(t, f, "gzramd_mem_limit_bytes", 0)
	want(t, f, "gzramd_same_pages", float64(st.SamePages))
	want(t, f, "gzramd_huge_pages", float64(st.HugePages))
	want(t, f, "gzramd_stored_pages", float64(st.StoredPages))
	want(t, f, "gzramd_packed_pages", float64(st.PackedPages))
	want(t, f, "gzramd_packed_objects", float64(st.PackedObjects))
	want(t, f, "gzramd_notify_free_total", float64(st.NotifyFree))
	want(t, f, "gzramd_invalid_io_total", 1)
	want(t, f, "gzramd_failed_reads_total", 0)
	want(t, f, "gzramd_failed_writes_total", 0)
	want(t, f, "gzramd_disksize_bytes", 64<<20)
	want(t, f, "gzramd_info", 1, "backend", "gpu", "algorithm", "lz4", "export", "gzram0")
	want(t, f, "gzramd_staged_pages", 0)
	want(t, f, "gzramd_staged_pages_total", float64(st.StagedWrites))
	want(t, f, "gzramd_staging_bytes", 1<<20)
	want(t, f, "gzramd_staging_unused_slots_total", float64(st.UnusedSlots))
	want(t, f, "gzramd_staging_batches_total", float64(st.Staging.SealedFull), "reason", "full")
	want(t, f, "gzramd_staging_batches_total", float64(st.Staging.SealedDeadline), "reason", "deadline")

	rs := s.pipe.Router.Stats()
	if rs.AcceleratorPages == 0 {
		t.Fatalf("nothing was compressed on the accelerator: %+v", rs)
	}
	want(t, f, "gzramd_compressed_pages_total", float64(rs.AcceleratorPages), "backend", "gpu")
	want(t, f, "gzramd_compressed_pages_total", float64(rs.CPUPages), "backend", "cpu")
	want(t, f, "gzramd_inline_pages_total", float64(rs.InlinePages))
	// The histograms saw every staged batch and its pages.
	want(t, f, "gzramd_batch_pages", float64(rs.AcceleratorBatches), "backend", "gpu")
	want(t, f, "gzramd_batch_duration_seconds", float64(rs.AcceleratorBatches), "backend", "gpu")
	var sum float64
	for _, m := range f["gzramd_batch_pages"].GetMetric() {
		sum += m.GetHistogram().GetSampleSum()
	}
	if uint64(sum) != st.StagedWrites {
		t.Errorf("gzramd_batch_pages_sum = %v over the backends, want the %d staged pages", sum, st.StagedWrites)
	}

	// The process collector matters for an mlock'd daemon; keep it.
	if _, ok := f.Value("process_resident_memory_bytes"); !ok {
		t.Error("process_resident_memory_bytes missing")
	}
	promtoolCheck(t, body)
}

func TestNBDCounters(t *testing.T) {
	s := newStack(t, 1<<20)
	s.nbd.RequestDone(nbd.CmdWrite, 4096, 30*time.Microsecond, 0)
	s.nbd.RequestDone(nbd.CmdWrite, 8192, 2*time.Millisecond, 0)
	s.nbd.RequestDone(nbd.CmdWrite, 4096, time.Millisecond, uint32(syscall.ENOSPC))
	s.nbd.RequestDone(nbd.CmdTrim, 1<<20, 5*time.Microsecond, 0)
	s.nbd.RequestDone(nbd.CmdRead, 4096, 20*time.Second, uint32(syscall.EIO))
	s.nbd.RequestDone(nbd.Command(99), 0, time.Microsecond, uint32(syscall.EINVAL))
	s.nbd.RequestDone(nbd.CmdFlush, 0, time.Microsecond, 1234)

	f, body := s.scrape(t)
	want(t, f, "gzramd_nbd_requests_total", 3, "command", "write")
	want(t, f, "gzramd_nbd_requests_total", 1, "command", "trim")
	want(t, f, "gzramd_nbd_requests_total", 1, "command", "read")
	want(t, f, "gzramd_nbd_requests_total", 0, "command", "write_zeroes")
	want(t, f, "gzramd_nbd_requests_total", 1, "command", "unknown")
	want(t, f, "gzramd_nbd_request_bytes_total", 16384, "command", "write")
	want(t, f, "gzramd_nbd_request_bytes_total", 1<<20, "command", "trim")
	want(t, f, "gzramd_nbd_request_errors_total", 1, "command", "write", "error", "ENOSPC")
	want(t, f, "gzramd_nbd_request_errors_total", 1, "command", "read", "error", "EIO")
	want(t, f, "gzramd_nbd_request_errors_total", 1, "command", "unknown", "error", "EINVAL")
	want(t, f, "gzramd_nbd_request_errors_total", 1, "command", "flush", "error", "other")
	if _, ok := f.Value("gzramd_nbd_request_errors_total", "command", "trim"); ok {
		t.Error("an error series for trim exists though no trim failed")
	}

	// The latency buckets are cumulative and in seconds.
	var h = histogramOf(t, f, "gzramd_nbd_request_duration_seconds", "write")
	if h.GetSampleCount() != 3 {
		t.Fatalf("write latency count = %d, want 3", h.GetSampleCount())
	}
	if sum := h.GetSampleSum(); sum < 0.00302 || sum > 0.00304 {
		t.Errorf("write latency sum = %v s, want 0.00303", sum)
	}
	for _, b := range h.GetBucket() {
		var wantN uint64
		switch ub := b.GetUpperBound(); {
		case ub >= 0.0025:
			wantN = 3
		case ub >= 0.001:
			wantN = 2
		case ub >= 0.00003:
			wantN = 1
		}
		if b.GetCumulativeCount() != wantN {
			t.Errorf("write latency bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), wantN)
		}
	}
	// 20 s is above every bound: only +Inf (the count) holds it.
	r := histogramOf(t, f, "gzramd_nbd_request_duration_seconds", "read")
	if r.GetSampleCount() != 1 {
		t.Errorf("read latency count = %d, want 1", r.GetSampleCount())
	}
	for _, b := range r.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) && b.GetCumulativeCount() != 0 {
			t.Errorf("a 20s read landed in the bucket le=%v", b.GetUpperBound())
		}
	}
	promtoolCheck(t, body)
}

// The ublk device's requests are counted as NBD's are, under their own
// families and the driver's operations.
func TestUblkCounters(t *testing.T) {
	u := NewUblk()
	u.RequestDone(ublk.OpWrite, 4096, 30*time.Microsecond, 0)
	u.RequestDone(ublk.OpWrite, 131072, time.Millisecond, syscall.ENOSPC)
	u.RequestDone(ublk.OpDiscard, 1<<21, 5*time.Microsecond, 0)
	u.RequestDone(ublk.OpRead, 4096, 20*time.Microsecond, syscall.EIO)
	u.RequestDone(ublk.OpWriteSame, 4096, time.Microsecond, syscall.EOPNOTSUPP)
	u.RequestDone(ublk.Op(77), 0, time.Microsecond, syscall.EOPNOTSUPP)
	f, body := scraper(t, u)()
	want(t, f, "gzramd_ublk_requests_total", 2, "command", "write")
	want(t, f, "gzramd_ublk_requests_total", 1, "command", "discard")
	want(t, f, "gzramd_ublk_requests_total", 1, "command", "read")
	want(t, f, "gzramd_ublk_requests_total", 0, "command", "flush")
	want(t, f, "gzramd_ublk_requests_total", 1, "command", "write_same")
	want(t, f, "gzramd_ublk_requests_total", 1, "command", "unknown")
	want(t, f, "gzramd_ublk_request_bytes_total", 135168, "command", "write")
	want(t, f, "gzramd_ublk_request_bytes_total", 1<<21, "command", "discard")
	want(t, f, "gzramd_ublk_request_errors_total", 1, "command", "write", "error", "ENOSPC")
	want(t, f, "gzramd_ublk_request_errors_total", 1, "command", "read", "error", "EIO")
	want(t, f, "gzramd_ublk_request_errors_total", 1, "command", "unknown", "error", "ENOTSUP")
	if h := histogramOf(t, f, "gzramd_ublk_request_duration_seconds", "write"); h.GetSampleCount() != 2 {
		t.Errorf("write latency count = %d, want 2", h.GetSampleCount())
	}
	if a := testing.AllocsPerRun(1000, func() { u.RequestDone(ublk.OpRead, 4096, time.Microsecond, 0) }); a != 0 {
		t.Errorf("Ublk.RequestDone allocates %v times per call", a)
	}
	promtoolCheck(t, body)
}

func histogramOf(t *testing.T, f Families, name, command string) interface {
	GetSampleCount() uint64
	GetSampleSum() float64
	GetBucket() []*dto.Bucket
} {
	t.Helper()
	for _, m := range f[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "command" && l.GetValue() == command {
				return m.GetHistogram()
			}
		}
	}
	t.Fatalf("%s{command=%q} missing", name, command)
	return nil
}

func TestObserversDoNotAllocate(t *testing.T) {
	n := NewNBD()
	b := NewBatches()
	b.Track("gpu")
	if a := testing.AllocsPerRun(1000, func() {
		n.RequestDone(nbd.CmdWrite, 4096, time.Millisecond, 0)
		n.RequestDone(nbd.CmdRead, 4096, time.Millisecond, uint32(syscall.EIO))
	}); a != 0 {
		t.Errorf("NBD.RequestDone allocates %v times per call", a)
	}
	if a := testing.AllocsPerRun(1000, func() { b.BatchDone("gpu", 256, time.Millisecond) }); a != 0 {
		t.Errorf("Batches.BatchDone allocates %v times per call", a)
	}
}

func TestBatchBackendsAreBounded(t *testing.T) {
	b := NewBatches()
	for i := range 3 * maxBackends {
		b.BatchDone(strings.Repeat("x", i+1), 1, time.Microsecond)
	}
	if n := len(*b.backends.Load()); n != maxBackends+1 {
		t.Fatalf("%d backends tracked, want %d (the bound plus \"other\")", n, maxBackends+1)
	}
}

func BenchmarkRequestDone(b *testing.B) {
	n := NewNBD()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.RequestDone(nbd.CmdWrite, 4096, 50*time.Microsecond, 0)
		}
	})
}

// promtoolCheck runs `promtool check metrics` (Debian package prometheus)
// on a scrape.
// scraper serves the collectors' metrics and returns a function that
// scrapes and parses them.
func scraper(t *testing.T, collectors ...prometheus.Collector) func() (Families, []byte) {
	t.Helper()
	reg, err := NewRegistry(collectors...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(reg, nil))
	t.Cleanup(srv.Close)
	return func() (Families, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		f, err := Parse(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%v\n%s", err, body)
		}
		return f, body
	}
}

func promtoolCheck(t *testing.T, body []byte) {
	t.Helper()
	path, ok := testneeds.CommandFor(t, "promtool", "prometheus", "the scrape not linted")
	if !ok {
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

func TestGPUCollector(t *testing.T) {
	tele := GPUTelemetry{Name: "NVIDIA H100", MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 80 << 30,
		UtilizationGPU: 42, UtilizationMemory: 7, TemperatureC: 55, PCIeTxBytesPerSec: 1e9, PCIeRxBytesPerSec: 2e9}
	var teleErr error
	g := NewGPU(0, func() GPUCounters { return GPUCounters{Batches: 10, Small: 3, Fallbacks: 2, Timeouts: 1, Skipped: 1} },
		func() (GPUTelemetry, error) { return tele, teleErr }, nil)
	get := scraper(t, g)
	f, body := get()
	want(t, f, "gzramd_gpu_batches_total", 10, "gpu", "0")
	want(t, f, "gzramd_gpu_fallbacks_total", 2, "gpu", "0")
	want(t, f, "gzramd_gpu_timeouts_total", 1, "gpu", "0")
	want(t, f, "gzramd_gpu_small_batches_total", 3, "gpu", "0")
	want(t, f, "gzramd_gpu_utilization_ratio", 0.42, "gpu", "0", "name", "NVIDIA H100")
	want(t, f, "gzramd_gpu_memory_total_bytes", 80<<30, "gpu", "0")
	want(t, f, "gzramd_gpu_temperature_celsius", 55, "gpu", "0")
	promtoolCheck(t, body)

	// Telemetry failing drops it from the scrape but keeps the counters.
	teleErr = errors.New("nvml: GPU is lost")
	f, _ = get()
	want(t, f, "gzramd_gpu_fallbacks_total", 2, "gpu", "0")
	if _, ok := f.Value("gzramd_gpu_temperature_celsius"); ok {
		t.Error("telemetry exported although NVML failed")
	}
}

type traceCounts struct{ written, dropped uint64 }

func (c *traceCounts) Written() uint64 { return c.written }
func (c *traceCounts) Dropped() uint64 { return c.dropped }

func TestTraceCollector(t *testing.T) {
	c := &traceCounts{written: 12345, dropped: 6}
	f, body := scraper(t, NewTrace(c))()
	want(t, f, "gzramd_trace_records_total", 12345)
	want(t, f, "gzramd_trace_dropped_records_total", 6)
	promtoolCheck(t, body)
}

// TestScrapeShowsTiers ages a device into the dense tier and checks the
// tiers' gauges and the recompressor's counters against its statistics.
func TestScrapeShowsTiers(t *testing.T) {
	const pages = 256
	p, err := pipeline.New(pipeline.Config{
		Size: 16 << 20, Dense: device.DenseConfig{After: time.Millisecond, CPU: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	get := scraper(t, NewNBD(), NewBatches(), NewDevice(Info{Version: "test", Export: "gzram0", Algorithm: "lz4", Backend: "cpu", DiskSize: 16 << 20},
		p.Device.Stats, p.Router.Stats))
	ctx := context.Background()
	// Pages alike but not the same: zstd over a group finds what LZ4
	// over a page does not.
	r := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 2*pageSize)
	for i := range pool {
		pool[i] = byte(r.Uint32())
	}
	data := make([]byte, pages*pageSize)
	for i := range pages {
		copy(data[i*pageSize:], pool[i%8*512:][:pageSize])
	}
	if err := p.Device.WriteAt(ctx, data, 0, false); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		p.Device.RunDense(dctx)
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Device.Stats().Dense.Groups < pages/16/2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	st := p.Device.Stats()
	if st.DensePages == 0 || st.Dense.Groups == 0 {
		t.Fatalf("nothing went to the dense tier: %+v", st)
	}
	f, _ := get()
	want(t, f, "gzramd_tier_pages", float64(st.StoredPages-st.DensePages), "tier", "fast")
	want(t, f, "gzramd_tier_pages", float64(st.DensePages), "tier", "dense")
	want(t, f, "gzramd_tier_bytes", float64(st.ComprDataSize-st.DenseBytes), "tier", "fast")
	want(t, f, "gzramd_tier_bytes", float64(st.DenseBytes), "tier", "dense")
	want(t, f, "gzramd_dense_recompressed_groups_total", float64(st.Dense.Groups))
	want(t, f, "gzramd_dense_recompressed_pages_total", float64(st.Dense.Pages))
	want(t, f, "gzramd_dense_recompressed_bytes_total", float64(st.Dense.BytesIn), "when", "before")
	want(t, f, "gzramd_dense_recompressed_bytes_total", float64(st.Dense.BytesOut), "when", "after")
	want(t, f, "gzramd_dense_skipped_groups_total", float64(st.Dense.Kept), "reason", "kept")
	if st.Dense.BytesOut >= st.Dense.BytesIn {
		t.Errorf("recompressed %d bytes into %d", st.Dense.BytesIn, st.Dense.BytesOut)
	}
}
