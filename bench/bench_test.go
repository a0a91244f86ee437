// Tests of the benchmark scripts: the arithmetic their reports rest on
// (medians over rounds, ratios within a round), and short real runs of
// bench/grid.sh and bench/trace.sh against gzramd with fio.
package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// lib runs a bash snippet with bench/lib.sh sourced and returns its
// standard output.
func lib(t *testing.T, snippet string, env ...string) string {
	t.Helper()
	testneeds.Command(t, "python3", "python3") // bench/lib.sh runs it
	cmd := exec.Command("bash", "-c", ". ./lib.sh && "+snippet)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s: %v\n%s", snippet, err, stderr)
	}
	return string(out)
}

// Rows as grid.sh writes them: cell, target, round, MB/s, IOPS,
// CPU-s/GB, p50, p99.
const rows = `c1 a 1 100 1 2.0 10 20
c1 b 1 90 1 4.0 10 20
c1 a 2 300 1 1.0 10 20
c1 b 2 100 1 0.5 10 20
c1 a 3 200 1 3.0 10 20
c1 b 3 110 1 2.0 10 20
c2 a 1 10 1 1.0 10 20
`

func writeRows(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "rows")
	if err := os.WriteFile(p, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMedians(t *testing.T) {
	got := lib(t, "bench_medians 2 "+writeRows(t))
	want := "c1 a 3 200 1 2 10 20\nc1 b 3 100 1 2 10 20\nc2 a 1 10 1 1 10 20\n"
	if got != want {
		t.Errorf("bench_medians:\n%s\nwant\n%s", got, want)
	}
}

// The ratio of a case is the median of the ratios within each round
// (1.11, 3, 1.82 for MB/s; 0.5, 2, 1.5 for CPU), not the ratio of the
// medians (200/100 and 2/2); a case one side did not run gets "-".
func TestRatioTable(t *testing.T) {
	got := lib(t, "bench_ratio_table "+writeRows(t)+" a/b")
	for _, want := range []string{"| case | a/b MB/s | a/b CPU |", "| c1 | 1.82 | 1.50 |", "| c2 | - | - |"} {
		if !strings.Contains(got, want) {
			t.Errorf("bench_ratio_table lacks %q:\n%s", want, got)
		}
	}
}

// gzramd builds the daemon for the script runs.
func gzramd(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs fio against a daemon")
	}
	testneeds.Command(t, "fio", "fio")
	testneeds.Command(t, "python3", "python3") // bench/lib.sh runs it
	bin := filepath.Join(t.TempDir(), "gzramd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gzramd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func run(t *testing.T, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
}

func TestGridRuns(t *testing.T) {
	bin := gzramd(t)
	out := run(t, "./grid.sh", "GZRAMD="+bin, "BENCH_SIZE=64M", "BENCH_REGION=32M",
		"GRID_TARGETS=gzramd-cpu gzramd-cpu-zstd", "GRID_CELLS=randwrite-4k-qd1-j1", "GRID_RUNTIME=1",
		"GRID_ROUNDS=2", "GRID_PAIRS=gzramd-cpu-zstd/gzramd-cpu")
	for _, want := range []string{
		"| randwrite-4k-qd1-j1 | gzramd-cpu |", "| randwrite-4k-qd1-j1 | gzramd-cpu-zstd |",
		"median of 2 rounds", "| case | gzramd-cpu-zstd/gzramd-cpu MB/s |",
		"randwrite-4k-qd1-j1 gzramd-cpu 2 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("grid.sh output lacks %q:\n%s", want, out)
		}
	}
}

func TestTraceRuns(t *testing.T) {
	bin := gzramd(t)
	testneeds.Command(t, "zstd", "zstd") // the committed trace is compressed
	// gzramd-cpu+b is an A/B variant (bench/lib.sh): here the same
	// binary with flags of its own, which the log must show it ran with.
	out := run(t, "./trace.sh", "GZRAMD="+bin, "TRACE_TARGETS=gzramd-cpu gzramd-cpu+b", "TRACE_JOBS=1",
		"TRACE_REPEAT=1", "TRACE_ROUNDS=2", "TRACE_PAIRS=gzramd-cpu/gzramd-cpu", "GZRAMD_b="+bin,
		"GZRAMD_ARGS_b=--prefault 8MiB")
	for _, want := range []string{"| gzramd-cpu | 1 |", "| gzramd-cpu+b | 1 |", "0.0% |", "| jobs-1 | 1.00 | 1.00 |", "gzramd-cpu 1 2 "} {
		if !strings.Contains(out, want) {
			t.Errorf("trace.sh output lacks %q:\n%s", want, out)
		}
	}
}

func TestOrderAlternates(t *testing.T) {
	for round, want := range map[string]string{"1": "a b c", "2": "c b a", "3": "a b c"} {
		if got := strings.Join(strings.Fields(lib(t, "bench_order "+round+" a b c")), " "); got != want {
			t.Errorf("bench_order %s a b c = %q, want %q", round, got, want)
		}
	}
}

// The footprint report from raw readings: the median start's processes,
// the ratio of what was stored, and the swapped size from which gzramd
// saves more memory than zram: (own_gzramd - own_zram) / (1/ratio_zram -
// 1/ratio_gzramd), here (60000 - 40960) KiB / (1/2.5 - 1/3.333) = 0.18
// GiB; never when gzramd's ratio is the lower and its own memory larger;
// and again with gzramd's own memory as it is with the data stored.
func TestFootprintReport(t *testing.T) {
	raw := filepath.Join(t.TempDir(), "raw")
	readings := `drop gzramd-cpu-zstd 8GiB idle 1 70000
proc gzramd-cpu-zstd 8GiB idle 1 serving 90000 50000 80000 16384 0 0
drop gzramd-cpu-zstd 8GiB idle 2 60000
proc gzramd-cpu-zstd 8GiB idle 2 supervisor 10000 2000 9000 0 0 0
proc gzramd-cpu-zstd 8GiB idle 2 serving 80000 40000 70000 16384 0 0
drop gzramd-cpu-zstd 8GiB idle 3 50000
drop gzramd-cpu-zstd 8GiB stored 3 380000
store gzramd-cpu-zstd 8GiB 3 1073741824 322122547 1044537344
drop gzramd-cpu-lz4 8GiB idle 1 61000
drop gzramd-cpu-lz4 8GiB stored 1 480000
store gzramd-cpu-lz4 8GiB 1 1073741824 466848139 1044537344
drop zram-lzo-rle 8GiB idle 1 40960
drop zram-lzo-rle 8GiB stored 1 460000
store zram-lzo-rle 8GiB 1 1073741824 429496730 1073741824
`
	if err := os.WriteFile(raw, []byte(readings), 0o644); err != nil {
		t.Fatal(err)
	}
	testneeds.Command(t, "python3", "python3") // bench/footprint.sh runs it
	b, err := exec.Command("bash", "./footprint.sh", "--report", raw).CombinedOutput()
	if err != nil {
		t.Fatalf("footprint.sh --report: %v\n%s", err, b)
	}
	out := string(b)
	for _, want := range []string{
		"| gzramd-cpu-zstd | 8GiB | idle | 58.6 (median of 3) | supervisor | 9.8 | 2.0 | 8.8 | 0.0 | 0.0 | 0.0 |",
		"| | | | | serving | 78.1 | 39.1 | 68.4 | 16.0 | 0.0 | 0.0 |",
		"ratio 3.333",
		"| gzramd-cpu-zstd | 8GiB | 58.6 | 3.333 | 0.18 GiB (40.0, 2.500) |",
		"| gzramd-cpu-lz4 | 8GiB | 59.6 | 2.300 | never (40.0, 2.500) |",
		"The same with gzramd's own memory as it is with the data stored",
		"| gzramd-cpu-zstd | 8GiB | 63.9 | 3.333 | 0.23 GiB (40.0, 2.500) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("footprint.sh --report lacks %q:\n%s", want, out)
		}
	}
}
