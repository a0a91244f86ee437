package swaptrace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/DataDog/zstd"
)

// TestReadsTheRecordedTrace reads bench/traces/host-2.iolog.zst and
// finds the requests its README counts.
func TestReadsTheRecordedTrace(t *testing.T) {
	reqs, err := Read("../../bench/traces/host-2.iolog.zst")
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range reqs {
		n[r.Op]++
	}
	if n["read"] != 15240 || n["write"] != 2618 || n["trim"] != 94 {
		t.Fatalf("%d reads, %d writes, %d trims; the README counts 15240, 2618 and 94", n["read"], n["write"], n["trim"])
	}
}

// TestRefusesABadRequest: a request whose numbers do not parse is an
// error, not a request left out.
func TestRefusesABadRequest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.iolog.zst")
	text := "fio version 2 iolog\ngzram0 add\ngzram0 open\ngzram0 read 0 4096\ngzram0 read x 4096\n"
	z, err := zstd.Compress(nil, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, z, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil {
		t.Fatal("a read at offset x was taken")
	}
}
