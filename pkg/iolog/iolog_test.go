package iolog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/fiotest"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
)

// bufferOut is a trace file in memory.
type bufferOut struct {
	bytes.Buffer
	closed bool
}

func (b *bufferOut) Close() error {
	b.closed = true
	return nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestFormat(t *testing.T) {
	out := &bufferOut{}
	r := newRecorder(out, "mem", "gzram0", 16, quiet())
	if err := r.writeHeader(); err != nil {
		t.Fatal(err)
	}
	r.RecordRequest(nbd.CmdWrite, 8192, 131072)
	r.RecordRequest(nbd.CmdRead, 1<<40, 4096)
	r.RecordRequest(nbd.CmdFlush, 77, 88) // a flush's fields mean nothing
	r.RecordRequest(nbd.CmdTrim, 4096, 536866816)
	r.RecordRequest(nbd.CmdWriteZeroes, 65536, 65536)
	r.RecordRequest(nbd.CmdRead, 4096, 0) // changes nothing: left out
	r.RecordRequest(nbd.CmdWrite, 4096, 0)
	r.RecordRequest(nbd.CmdCache, 0, 4096) // not a request the server runs
	r.RecordRequest(nbd.CmdDisc, 0, 0)
	r.RecordRequest(nbd.CmdRead, 0, 1)
	r.drain()
	if err := r.finish(); err != nil {
		t.Fatal(err)
	}
	want := `fio version 2 iolog
gzram0 add
gzram0 open
gzram0 write 8192 131072
gzram0 read 1099511627776 4096
gzram0 sync 0 0
gzram0 trim 4096 536866816
gzram0 trim 65536 65536
gzram0 read 0 1
gzram0 close
`
	if got := out.String(); got != want {
		t.Errorf("trace:\n%s\nwant:\n%s", got, want)
	}
	if !out.closed {
		t.Error("finish did not close the file")
	}
	if r.Written() != 6 || r.Dropped() != 0 {
		t.Errorf("written %d, dropped %d; want 6, 0", r.Written(), r.Dropped())
	}
}

func TestFileName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"gzram0", "gzram0"},
		{"", "nbd"},
		{"my disk\t1\n", "my_disk_1_"},
		{strings.Repeat("x", 300), strings.Repeat("x", 256)},
		{"/dev/nbd0", "/dev/nbd0"},
	} {
		if got := string(fileName(c.in)); got != c.want {
			t.Errorf("fileName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A full ring drops what does not fit, counts it, and takes records
// again once drained; what it kept comes out in order.
func TestFullRingDropsAndCounts(t *testing.T) {
	out := &bufferOut{}
	r := newRecorder(out, "mem", "d", 8, quiet())
	for i := range 13 {
		r.RecordRequest(nbd.CmdWrite, uint64(i)*4096, 4096)
	}
	if d := r.Dropped(); d != 5 {
		t.Fatalf("dropped %d of 13 records in a ring of 8, want 5", d)
	}
	r.drain()
	for i := 13; i < 16; i++ {
		r.RecordRequest(nbd.CmdRead, uint64(i)*4096, 4096)
	}
	if err := r.finish(); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 8 {
		fmt.Fprintf(&want, "d write %d 4096\n", i*4096)
	}
	for i := 13; i < 16; i++ {
		fmt.Fprintf(&want, "d read %d 4096\n", i*4096)
	}
	want.WriteString("d close\n")
	if got := out.String(); got != want.String() {
		t.Errorf("trace:\n%s\nwant:\n%s", got, want.String())
	}
	if r.Written() != 11 || r.Dropped() != 5 {
		t.Errorf("written %d, dropped %d; want 11, 5", r.Written(), r.Dropped())
	}
}

// Many connections record at once while the ring is drained: every
// record is either in the trace, in its connection's order, or counted as
// dropped. Run it with -race.
func TestConcurrentRecording(t *testing.T) {
	const writers, each, slots = 8, 20000, 256
	out := &bufferOut{}
	r := newRecorder(out, "mem", "d", slots, quiet())
	if err := r.writeHeader(); err != nil {
		t.Fatal(err)
	}
	// The drainer's loop without its pauses, so that pushes and pops
	// meet all the time.
	stop, drained := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-stop:
				return
			default:
				r.drain()
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				if i == each/2 {
					// Halfway, wait for the drainer to have run at least
					// once, so that a loaded machine that never schedules it
					// while writers run cannot pass the ring off as never
					// drained: the rest then fills it at least once more.
					for r.Written() == 0 {
						runtime.Gosched()
					}
				}
				r.RecordRequest(nbd.CmdWrite, uint64(g)<<32|uint64(i), 4096)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-drained
	if err := r.finish(); err != nil {
		t.Fatal(err)
	}

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) < 4 || lines[0] != "fio version 2 iolog" || lines[1] != "d add" || lines[2] != "d open" || lines[len(lines)-1] != "d close" {
		t.Fatalf("trace does not start and end as an iolog: %q ... %q", lines[:min(3, len(lines))], lines[len(lines)-1])
	}
	next := make([]uint64, writers)
	n := 0
	for _, l := range lines[3 : len(lines)-1] {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "d" || f[1] != "write" || f[3] != "4096" {
			t.Fatalf("bad line %q", l)
		}
		off, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		g, i := off>>32, off&(1<<32-1)
		if g >= writers || i < next[g] {
			t.Fatalf("line %q out of its writer's order (next %d)", l, next[g])
		}
		next[g] = i + 1
		n++
	}
	if uint64(n) != r.Written() || uint64(n)+r.Dropped() != writers*each {
		t.Errorf("%d lines, written %d, dropped %d: want lines = written, lines + dropped = %d",
			n, r.Written(), r.Dropped(), writers*each)
	}
	if n <= slots {
		t.Errorf("only %d records written: the ring was not drained while written to", n)
	}
	t.Logf("%d records written, %d dropped", n, r.Dropped())
}

// Recording allocates nothing, whether the record fits or is dropped;
// neither does draining.
func TestRecordingDoesNotAllocate(t *testing.T) {
	r := newRecorder(&bufferOut{}, "mem", "gzram0", 1<<12, quiet())
	// The buffer grows once to its steady size.
	for range 1 << 12 {
		r.RecordRequest(nbd.CmdWrite, 1<<30, 131072)
	}
	r.drain()
	r.out.(*bufferOut).Reset()

	off := uint64(0)
	if n := testing.AllocsPerRun(1000, func() {
		off += 4096
		r.RecordRequest(nbd.CmdRead, off, 4096)
	}); n != 0 {
		t.Errorf("RecordRequest into a ring with room: %v allocations", n)
	}
	for r.ring.push(record{cmd: nbd.CmdWrite, length: 1}) {
	}
	dropped := r.Dropped()
	if n := testing.AllocsPerRun(1000, func() { r.RecordRequest(nbd.CmdWrite, 0, 4096) }); n != 0 {
		t.Errorf("RecordRequest into a full ring: %v allocations", n)
	}
	if r.Dropped() != dropped+1001 {
		t.Errorf("dropped %d records into a full ring, want 1001", r.Dropped()-dropped)
	}
	if n := testing.AllocsPerRun(10, func() {
		r.out.(*bufferOut).Reset()
		for i := range 1000 {
			r.RecordRequest(nbd.CmdWrite, uint64(i)<<17, 131072)
		}
		r.drain()
	}); n != 0 {
		t.Errorf("draining 1000 records: %v allocations", n)
	}
}

func TestWarnsAboutDropsOncePerSecond(t *testing.T) {
	var logs bytes.Buffer
	r := newRecorder(&bufferOut{}, "mem", "d", 8, slog.New(slog.NewTextHandler(&logs, nil)))
	warnings := func() int { return strings.Count(logs.String(), "requests not recorded") }
	t0 := time.Now()
	r.warnDropped(t0)
	if warnings() != 0 {
		t.Fatal("warned with nothing dropped")
	}
	r.dropped.Add(3)
	r.warnDropped(t0)
	r.dropped.Add(2)
	r.warnDropped(t0.Add(500 * time.Millisecond))
	if warnings() != 1 || !strings.Contains(logs.String(), "dropped=3 dropped_total=3") {
		t.Fatalf("after drops 0.5 s apart, want one warning:\n%s", logs.String())
	}
	r.warnDropped(t0.Add(time.Second))
	if warnings() != 2 || !strings.Contains(logs.String(), "dropped=2 dropped_total=5") {
		t.Fatalf("a second later, want a second warning for 2 more:\n%s", logs.String())
	}
	r.warnDropped(t0.Add(5 * time.Second))
	if warnings() != 2 {
		t.Fatalf("warned again with no new drops:\n%s", logs.String())
	}
}

// failingOut takes the header, then fails every write.
type failingOut struct {
	n int
}

var errDiskFull = errors.New("disk full")

func (f *failingOut) Write(p []byte) (int, error) {
	f.n++
	if f.n > 1 {
		return 0, errDiskFull
	}
	return len(p), nil
}

func (f *failingOut) Close() error { return nil }

// After a write fails, the records are counted as dropped and Close
// reports the error.
func TestWriteFailure(t *testing.T) {
	r := newRecorder(&failingOut{}, "/full/trace", "d", 16, quiet())
	if err := r.writeHeader(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r.RecordRequest(nbd.CmdWrite, 0, 4096)
	}
	r.drain()
	for range 3 {
		r.RecordRequest(nbd.CmdWrite, 0, 4096)
	}
	err := r.finish()
	if !errors.Is(err, errDiskFull) || !strings.Contains(err.Error(), "/full/trace") {
		t.Errorf("finish: %v, want the write error naming the file", err)
	}
	if r.Written() != 0 || r.Dropped() != 8 {
		t.Errorf("written %d, dropped %d; want 0, 8", r.Written(), r.Dropped())
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	if _, err := Create(filepath.Join(dir, "missing", "trace"), "d", quiet()); err == nil {
		t.Error("Create in a missing directory succeeded")
	}
	path := filepath.Join(dir, "trace")
	if err := os.WriteFile(path, []byte("an older, longer trace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Create(path, "gzram0", quiet())
	if err != nil {
		t.Fatal(err)
	}
	r.RecordRequest(nbd.CmdWrite, 0, 4096)
	// The drainer writes the file as it goes, not only at Close.
	deadline := time.Now().Add(10 * time.Second)
	for r.Written() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	data, _ := os.ReadFile(path)
	if r.Written() != 1 || !strings.HasSuffix(string(data), "gzram0 write 0 4096\n") {
		t.Fatalf("before Close: written %d, file:\n%s", r.Written(), data)
	}
	r.RecordRequest(nbd.CmdRead, 0, 4096)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(path)
	want := "fio version 2 iolog\ngzram0 add\ngzram0 open\ngzram0 write 0 4096\ngzram0 read 0 4096\ngzram0 close\n"
	if string(data) != want {
		t.Errorf("trace:\n%s\nwant:\n%s", data, want)
	}
}

// countLines counts the I/O lines of a trace by action.
func countLines(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] != "fio" {
			n[f[1]]++
		}
	}
	return n
}

// fio replays a trace the Recorder wrote: every read, write and sync of
// it, and its trims where this fio replays trims.
func TestFioReplaysTrace(t *testing.T) {
	fio := testneeds.Command(t, "fio", "fio")
	dir := t.TempDir()
	path := filepath.Join(dir, "trace")
	r, err := Create(path, "gzram0", quiet())
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(300) {
		r.RecordRequest(nbd.CmdWrite, i<<17, 128<<10)
		if i%3 == 0 {
			r.RecordRequest(nbd.CmdRead, i<<17+4096, 32<<10)
		}
		if i%50 == 0 {
			r.RecordRequest(nbd.CmdFlush, 0, 0)
			r.RecordRequest(nbd.CmdTrim, i<<17, 64<<10)
			r.RecordRequest(nbd.CmdWriteZeroes, i<<17+64<<10, 64<<10)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	want := countLines(t, path)
	if want["write"] != 300 || want["read"] != 100 || want["sync"] != 6 || want["trim"] != 12 {
		t.Fatalf("trace holds %v", want)
	}

	// A plain file takes no trims (fio sends BLKDISCARD): where fio
	// replays them at all, it is told to skip them.
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(target, 64<<20); err != nil {
		t.Fatal(err)
	}
	args := []string{"--name=replay", "--ioengine=psync", "--read_iolog=" + path, "--replay_redirect=" + target,
		"--replay_no_stall=1", "--output-format=json"}
	trims := fiotest.ReplaysTrims(t, fio)
	if trims {
		args = append(args, "--replay_skip=trim")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(fio, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fio %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	got := fiotest.Issued(t, stdout.Bytes())
	if got["read"] != want["read"] || got["write"] != want["write"] || got["sync"] != want["sync"] || got["trim"] != 0 {
		t.Errorf("fio replayed %v of a trace holding %v", got, want)
	}
	// Before 3.34, fio skips each trim with this line; nothing else may
	// complain.
	errs := stderr.String()
	if !trims {
		errs = strings.Replace(errs, "bad ddir: 2\n", "", want["trim"])
	}
	if strings.TrimSpace(errs) != "" {
		t.Errorf("fio complained:\n%s", stderr.String())
	}
}

// BenchmarkRecordRequest measures what recording costs a request: into
// a ring with room, into a full ring (dropped), and from every CPU at once
// with the drainer running.
func BenchmarkRecordRequest(b *testing.B) {
	const slots = 1 << 16
	b.Run("kept", func(b *testing.B) {
		r := newRecorder(&bufferOut{}, "mem", "gzram0", slots, quiet())
		b.ReportAllocs()
		for i := range b.N {
			if i > 0 && i%slots == 0 {
				b.StopTimer()
				r.drain()
				r.out.(*bufferOut).Reset()
				b.StartTimer()
			}
			r.RecordRequest(nbd.CmdWrite, uint64(i)<<12, 4096)
		}
		if r.Dropped() != 0 {
			b.Fatalf("%d records dropped", r.Dropped())
		}
	})
	b.Run("dropped", func(b *testing.B) {
		r := newRecorder(&bufferOut{}, "mem", "gzram0", slots, quiet())
		for r.ring.push(record{cmd: nbd.CmdWrite, length: 1}) {
		}
		b.ReportAllocs()
		for i := range b.N {
			r.RecordRequest(nbd.CmdWrite, uint64(i)<<12, 4096)
		}
		if r.Dropped() != uint64(b.N) {
			b.Fatalf("%d of %d records dropped", r.Dropped(), b.N)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		r, err := Create(filepath.Join(b.TempDir(), "trace"), "gzram0", quiet())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			off := uint64(0)
			for pb.Next() {
				off += 4096
				r.RecordRequest(nbd.CmdWrite, off, 4096)
			}
		})
		b.StopTimer()
		r.Close()
		b.ReportMetric(float64(r.Dropped())/float64(b.N), "dropped/op")
	})
}

// BenchmarkDrain measures the drainer: formatting and buffering one
// record, a 128 KiB write at a large offset.
func BenchmarkDrain(b *testing.B) {
	r := newRecorder(&bufferOut{}, "mem", "gzram0", 1<<12, quiet())
	b.ReportAllocs()
	for i := 0; i < b.N; i += 1 << 12 {
		b.StopTimer()
		r.out.(*bufferOut).Reset()
		for j := range min(1<<12, b.N-i) {
			r.RecordRequest(nbd.CmdWrite, uint64(i+j)<<17, 128<<10)
		}
		b.StartTimer()
		r.drain()
	}
}
