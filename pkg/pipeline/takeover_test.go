package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/route/routetest"
)

// The data path a writer child serves: staged writes on a slow fake
// accelerator, so that a kill finds pages staged, in batches being
// compressed and committed, and stored.
const (
	takeoverSize    = 16 << 20
	takeoverWriters = 4
	takeoverRegion  = takeoverSize / pageBytes / takeoverWriters // pages each writer owns
	pageBytes       = 4096
)

// takeoverConfig is the data path the writer serves: with objectPages
// above 1, on the CPU alone, keeping the pages of each write together in
// objects of up to that many; with dense too, groups idle for 200 µs are
// recompressed into the dense tier.
func takeoverConfig(st *State, objectPages int, dense bool) Config {
	if objectPages > 1 {
		c := Config{Size: takeoverSize, State: st, ObjectPages: objectPages, ArenaSize: 2 << 20, Logger: quietLogger()}
		if dense {
			c.Dense = device.DenseConfig{After: 200 * time.Microsecond, CPU: 1}
		}
		return c
	}
	accel := routetest.NewAccelerator()
	accel.Delay.Store(int64(2 * time.Millisecond))
	return Config{
		Size: takeoverSize, State: st, Accelerator: accel, MinAcceleratorPages: 1,
		StagingBytes: 1 << 20, BatchPages: 32, BatchWorkers: 2, BatchDeadline: time.Millisecond,
		ArenaSize: 2 << 20, Logger: quietLogger(),
	}
}

// takeoverPage is page i of the write with this seed: zero-filled,
// filled with another word, compressible, or random.
func takeoverPage(seed uint64, i int, p []byte) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	switch r.IntN(8) {
	case 0:
		clear(p)
	case 1:
		w := r.Uint64() | 1
		for j := 0; j < len(p); j += 8 {
			binary.NativeEndian.PutUint64(p[j:], w)
		}
	case 2:
		for j := range p {
			p[j] = byte(r.Uint32())
		}
	default:
		for j := range p {
			p[j] = byte(j/64) ^ byte(r.IntN(3))
		}
	}
}

// TestTakeoverChild is the writer the takeover test kills: it serves the
// state passed as descriptors 3 to 7, compacts it all the time, and
// writes and trims in its writers' regions, printing "B w first n seed" (or "T w first n") before each
// request and "A w" once it returned.
func TestTakeoverChild(t *testing.T) {
	if os.Getenv("GZRAMD_TAKEOVER_CHILD") == "" {
		testneeds.Helper(t, "TestTakeoverAfterKill")
	}
	files := make([]*memfd.File, len(StateFileNames))
	for i := range files {
		f, err := memfd.Open(3 + i)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f
	}
	st, err := StateFrom(files)
	if err != nil {
		t.Fatal(err)
	}
	objectPages, _ := strconv.Atoi(os.Getenv("GZRAMD_TAKEOVER_OBJECTS"))
	dense := os.Getenv("GZRAMD_TAKEOVER_DENSE") != ""
	p, _, err := Open(takeoverConfig(st, objectPages, dense))
	if err != nil {
		t.Fatal(err)
	}
	go p.Device.RunDense(context.Background()) // groups recompressed while written, and when the kill comes
	seed, _ := strconv.ParseUint(os.Getenv("GZRAMD_TAKEOVER_CHILD"), 10, 64)
	var out sync.Mutex
	say := func(format string, a ...any) {
		out.Lock()
		os.Stdout.WriteString(fmt.Sprintf(format, a...) + "\n") // one write: in the pipe before a kill
		out.Unlock()
	}
	go func() { // objects move while the writers write, and when the kill comes
		for {
			time.Sleep(10 * time.Millisecond)
			p.Device.Compact()
		}
	}()
	var wg sync.WaitGroup
	for w := range takeoverWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			buf := make([]byte, 32*pageBytes)
			for op := 0; ; op++ {
				if dense && op%50 == 49 {
					time.Sleep(time.Millisecond) // groups go idle
				}
				n := 1 + r.IntN(32)
				first := w*takeoverRegion + r.IntN(takeoverRegion-n+1)
				if r.IntN(20) == 0 {
					say("T %d %d %d", w, first, n)
					if err := p.Device.Trim(context.Background(), int64(first)*pageBytes, int64(n)*pageBytes); err != nil {
						say("E %v", err)
						return
					}
				} else {
					s := r.Uint64()
					for i := range n {
						takeoverPage(s, i, buf[i*pageBytes:(i+1)*pageBytes])
					}
					say("B %d %d %d %d", w, first, n, s)
					if err := p.Device.WriteAt(context.Background(), buf[:n*pageBytes], int64(first)*pageBytes, false); err != nil {
						say("E %v", err)
						return
					}
				}
				say("A %d", w)
			}
		}()
	}
	wg.Wait()
}

// pageModel is what a page may read as: its acknowledged content, or,
// while a request for it was in flight when the writer died, that one's.
type pageModel struct {
	seed, page uint64 // content: takeoverPage(seed, page); seed 0 is zeroes
	maybe      *pageModel
}

// TestTakeoverAfterKill kills a process serving a state with SIGKILL, at a
// random moment, three times, and takes the state over each time: every
// acknowledged write reads back, a write in flight reads as either its
// old or its new content, nothing is lost or left staged, and the store
// holds exactly what the table references. The writes are staged for an
// accelerator, or, in objects, compressed inline and kept together in
// objects of up to 8 pages.
func TestTakeoverAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs writer processes for seconds")
	}
	t.Run("staged", func(t *testing.T) { testTakeoverAfterKill(t, 0, false) })
	t.Run("objects", func(t *testing.T) { testTakeoverAfterKill(t, 8, false) })
	t.Run("dense", func(t *testing.T) { testTakeoverAfterKill(t, 4, true) })
}

func testTakeoverAfterKill(t *testing.T, objectPages int, dense bool) {
	st, err := NewState("takeover-test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	model := make([]pageModel, takeoverSize/pageBytes)
	r := rand.New(rand.NewPCG(7, 7))
	for round := range 3 {
		events := runAndKill(t, st, uint64(round+1), 200+r.IntN(2000), objectPages, dense)
		pending := make([]string, takeoverWriters)
		for _, ev := range events {
			f := strings.Fields(ev)
			if f[0] == "E" {
				t.Fatalf("round %d: the writer failed: %s", round, ev)
			}
			w, _ := strconv.Atoi(f[1])
			if f[0] == "A" {
				apply(model, pending[w], false)
				pending[w] = ""
			} else {
				pending[w] = ev
			}
		}
		for _, ev := range pending {
			apply(model, ev, true)
		}
		// Taken over by a process without the dense tier: it still
		// reads and frees the tier's objects.
		p, rec, err := Open(takeoverConfig(st, objectPages, false))
		if err != nil {
			t.Fatalf("round %d: taking over: %v", round, err)
		}
		t.Logf("round %d: %d events before the kill; took over: %v", round, len(events), rec)
		if rec == nil || rec.Lost != 0 {
			t.Fatalf("round %d: recovered %v", round, rec)
		}
		checkPages(t, p, model)
		if err := p.Device.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		ds, ss := p.Device.Stats(), p.Store.Stats()
		if ss.Allocations != ds.StoredPages-ds.PackedPages+ds.PackedChunks+fills(t, p, model) || ss.Reserved != 0 || ss.BadHandles != 0 {
			t.Fatalf("round %d: store %+v for device %+v", round, ss, ds)
		}
		if objectPages > 1 && ds.PackedObjects == 0 {
			t.Fatalf("round %d: no object of several pages taken over: the test proved nothing", round)
		}
		if dense && ds.DensePages == 0 {
			t.Fatalf("round %d: no dense page taken over: the test proved nothing", round)
		}
		t.Logf("round %d: %d pages in %d objects of several pages, %d of them dense in %d objects", round, ds.PackedPages, ds.PackedObjects, ds.DensePages, ds.DenseObjects)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info()
	if err != nil || info.Takeovers < 3 {
		t.Fatalf("state info %+v, %v: want at least 3 takeovers", info, err)
	}
}

// runAndKill starts a writer child on st and kills it once it printed
// after events, returning everything it printed.
func runAndKill(t *testing.T, st *State, seed uint64, after, objectPages int, dense bool) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeoverChild$", "-test.v")
	cmd.Env = append(os.Environ(), "GZRAMD_TAKEOVER_CHILD="+strconv.FormatUint(seed, 10), "GZRAMD_TAKEOVER_OBJECTS="+strconv.Itoa(objectPages))
	if dense {
		cmd.Env = append(cmd.Env, "GZRAMD_TAKEOVER_DENSE=1")
	}
	for _, f := range st.Files() {
		cmd.ExtraFiles = append(cmd.ExtraFiles, f.OSFile())
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(out)
	killed := false
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 || !strings.ContainsAny(line[:1], "BTAE") || line[1] != ' ' {
			continue // go test's own output
		}
		events = append(events, line)
		if !killed && len(events) >= after {
			cmd.Process.Signal(syscall.SIGKILL)
			killed = true
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !killed || !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("writer ended before the kill (%v) after %d events:\n%s", err, len(events), stderr.String())
	}
	if _, err := io.Copy(io.Discard, out); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Log(err)
	}
	return events
}

// apply records the request ev in model: acknowledged, or in flight when
// the writer died (inFlight), in which case either content may be read.
func apply(model []pageModel, ev string, inFlight bool) {
	if ev == "" {
		return
	}
	f := strings.Fields(ev)
	first, _ := strconv.Atoi(f[2])
	n, _ := strconv.Atoi(f[3])
	var seed uint64
	if f[0] == "B" {
		seed, _ = strconv.ParseUint(f[4], 10, 64)
	}
	for i := range n {
		now := pageModel{seed: seed, page: uint64(i)}
		if f[0] == "T" {
			now = pageModel{}
		}
		if inFlight {
			old := model[first+i]
			now.maybe = &pageModel{seed: old.seed, page: old.page}
		}
		model[first+i] = now
	}
}

func (m pageModel) content(p []byte) {
	if m.seed == 0 {
		clear(p)
		return
	}
	takeoverPage(m.seed, int(m.page), p)
}

func checkPages(t *testing.T, p *Pipeline, model []pageModel) {
	t.Helper()
	got, want := make([]byte, pageBytes), make([]byte, pageBytes)
	for i := range model {
		if err := p.Device.ReadAt(context.Background(), got, int64(i)*pageBytes); err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		model[i].content(want)
		if bytes.Equal(got, want) {
			model[i].maybe = nil
			continue
		}
		if m := model[i].maybe; m != nil {
			if m.content(want); bytes.Equal(got, want) {
				model[i] = *m // the write in flight did not land
				continue
			}
		}
		t.Fatalf("page %d reads neither its acknowledged content nor a write in flight", i)
	}
}

// fills counts the pages filled with a word other than zero, each of
// which keeps its word in an object.
func fills(t *testing.T, p *Pipeline, model []pageModel) int64 {
	t.Helper()
	var n int64
	page := make([]byte, pageBytes)
	for i := range model {
		model[i].content(page)
		w := binary.NativeEndian.Uint64(page)
		if w == 0 {
			continue
		}
		same := true
		for j := 8; j < len(page); j += 8 {
			if binary.NativeEndian.Uint64(page[j:]) != w {
				same = false
				break
			}
		}
		if same {
			n++
		}
	}
	return n
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
