package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/gzramd/gzramd/internal/corpus"
)

// Captured from this test's own process, which may always read its own
// memory: whole pages that internal/corpus loads, as the manifest counts.
func TestCaptureLoads(t *testing.T) {
	hold := bytes.Repeat([]byte("gzramd corpus "), 1<<16) // resident, not zero
	out := filepath.Join(t.TempDir(), "pages.bin.zst")
	if err := run(out, []int{os.Getpid()}, 64); err != nil {
		t.Fatal(err)
	}
	pages, err := corpus.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(pages) / corpus.PageSize; n != 64 {
		t.Errorf("%d pages captured, want 64", n)
	}
	if _, err := os.Stat(out + ".json"); err != nil {
		t.Error(err)
	}
	_ = hold[len(hold)-1]
}

func TestCaptureNothingReadableFails(t *testing.T) {
	var buf bytes.Buffer
	if _, err := capture(&buf, []int{1 << 30}, 8, &buf); err == nil {
		t.Error("capture of a process that does not exist succeeded")
	}
}

func TestSampleSpreadsEvenly(t *testing.T) {
	addrs := make([]uint64, 100)
	for i := range addrs {
		addrs[i] = uint64(i)
	}
	got := sample(addrs, 4)
	if want := []uint64{0, 25, 50, 75}; !bytes.Equal(u64bytes(got), u64bytes(want)) {
		t.Errorf("sample = %v, want %v", got, want)
	}
	if len(sample(addrs[:3], 4)) != 3 {
		t.Error("sample of fewer than n changed them")
	}
}

func u64bytes(v []uint64) []byte {
	var b []byte
	for _, x := range v {
		b = append(b, byte(x))
	}
	return b
}
