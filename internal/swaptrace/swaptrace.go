// Package swaptrace reads the recorded swap traces of bench/traces: fio
// iologs (version 2), as `gzramd serve --record-trace` writes them
// (pkg/iolog), compressed with zstd, for the tests and benchmarks that
// replay them in process.
package swaptrace

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/DataDog/zstd"
)

// Request is a read, write or trim of the trace, in bytes.
type Request struct {
	Op       string // "read", "write" or "trim"
	Off, Len int64
}

// Read returns the reads, writes and trims of the trace at path, in
// order; the file actions and flushes are left out.
func Read(path string) ([]Request, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("swaptrace: %w", err)
	}
	text, err := zstd.Decompress(nil, raw)
	if err != nil {
		return nil, fmt.Errorf("swaptrace: %s: %w", path, err)
	}
	var reqs []Request
	for line := range bytes.Lines(text) {
		f := bytes.Fields(line)
		if len(f) != 4 {
			continue
		}
		op := string(f[1])
		if op != "read" && op != "write" && op != "trim" {
			continue
		}
		off, err1 := strconv.ParseInt(string(f[2]), 10, 64)
		n, err2 := strconv.ParseInt(string(f[3]), 10, 64)
		if err1 != nil || err2 != nil || off < 0 || n <= 0 {
			return nil, fmt.Errorf("swaptrace: %s: %q is not a request", path, bytes.TrimSpace(line))
		}
		reqs = append(reqs, Request{Op: op, Off: off, Len: n})
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("swaptrace: %s has no requests", path)
	}
	return reqs, nil
}
