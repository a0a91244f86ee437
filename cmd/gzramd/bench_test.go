package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestBenchReports(t *testing.T) {
	// A corpus file of generated pages: the command must read it, not
	// the shared corpus.
	path := filepath.Join(t.TempDir(), "pages.bin")
	if err := os.WriteFile(path, generatePages(1024), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := gzramd(t, nil, "bench", "--corpus", path, "--min-time", "0", "--backends", "cpu-lz4,cpu-zstd,gpu")
	if code != 0 {
		t.Fatalf("bench: exit status %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, path+": 1024 pages") {
		t.Errorf("bench did not say it read %s:\n%s", path, out)
	}
	if strings.Contains(stderr, "\r") {
		t.Error("progress bar drawn on a stderr that is not a terminal")
	}
	row := regexp.MustCompile(`(?m)^cpu\s+(lz4|zstd)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$`)
	rows := row.FindAllStringSubmatch(out, -1)
	if len(rows) != 2 {
		t.Fatalf("want a cpu lz4 and a cpu zstd row:\n%s", out)
	}
	ratio := map[string]float64{}
	for _, r := range rows {
		for _, f := range r[2:] {
			if v, err := strconv.ParseFloat(f, 64); err != nil || v <= 0 {
				t.Errorf("%s row has a figure %q that is not positive:\n%s", r[1], f, out)
			}
		}
		ratio[r[1]], _ = strconv.ParseFloat(r[4], 64)
	}
	// Generated pages: 20% zero, 10% random, the rest compressible.
	if ratio["lz4"] < 1.5 || ratio["zstd"] < ratio["lz4"] {
		t.Errorf("ratios lz4 %v, zstd %v: want lz4 above 1.5 and zstd above lz4", ratio["lz4"], ratio["zstd"])
	}
	// A GPU row with figures, or a line saying why there is none.
	gpuRow := regexp.MustCompile(`(?m)^gpu\s+lz4\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$`)
	if !gpuRow.MatchString(out) && !strings.Contains(out, "gpu lz4: not measured: ") {
		t.Errorf("no gpu line:\n%s", out)
	}
	m := regexp.MustCompile(`effective ratio ([0-9.]+) \(orig_data_size`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no device ingest figures:\n%s", out)
	}
	if eff, _ := strconv.ParseFloat(m[1], 64); eff < 1.2 {
		t.Errorf("effective ratio %v through the device", eff)
	}
	if !regexp.MustCompile(`device ingest \(\w+ backend, lz4, 8 writers x 128K requests\): [0-9.]+ GB/s`).MatchString(out) {
		t.Errorf("device ingest line missing:\n%s", out)
	}
}

func TestBenchBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--backends", "cpu-lz5"},
		{"--corpus", "x", "--generated"},
		{"--writers", "0"},
	} {
		_, stderr, code := gzramd(t, nil, append([]string{"bench"}, args...)...)
		if code != 2 || lines(stderr) != 1 || !strings.Contains(stderr, args[0]) {
			t.Errorf("bench %v: status %d, stderr %q", args, code, stderr)
		}
	}
	_, stderr, code := gzramd(t, nil, "bench", "--corpus", "/nonexistent/pages.bin")
	if code != 1 || !strings.Contains(stderr, "/nonexistent/pages.bin") {
		t.Errorf("bench with a missing corpus: status %d, stderr %q", code, stderr)
	}
}
