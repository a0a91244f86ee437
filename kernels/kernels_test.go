package kernels

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestPTXFresh fails when a .cu source changed after its PTX was built:
// run `make ptx` on a machine with nvcc and commit the result.
func TestPTXFresh(t *testing.T) {
	for _, k := range []struct {
		source string
		ptx    []byte
	}{{"lz4.cu", LZ4}, {"zstd.cu", Zstd}, {"zstd_deep.cu", ZstdDeep}, {"zstd_dec.cu", ZstdDecode}} {
		want, err := sourceHashOf(k.source)
		if err != nil {
			t.Fatal(err)
		}
		got := SourceHash(k.ptx)
		if got == "" {
			t.Fatalf("PTX for %s records no source hash; rebuild it with build-ptx.sh", k.source)
		}
		if got != want {
			t.Errorf("PTX for %s is stale: built from source %s, source is now %s; run `make ptx` and commit kernels/*.ptx", k.source, got, want)
		}
	}
}

// sourceHashOf is build-ptx.sh's source hash: sha256 of the .cu and then
// each header it includes with #include "...", in order.
func sourceHashOf(cu string) (string, error) {
	src, err := os.ReadFile(cu)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(src)
	for _, line := range strings.Split(string(src), "\n") {
		rest, ok := strings.CutPrefix(line, `#include "`)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, `"`)
		hdr, err := os.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("%s includes %s: %w", cu, name, err)
		}
		h.Write(hdr)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func TestPTXDeclaresKernels(t *testing.T) {
	for _, k := range []struct {
		ptx   []byte
		names []string
	}{{LZ4, []string{"gz_lz4_compress", "gz_lz4_decompress"}}, {Zstd, []string{"gz_zstd_parse", "gz_zstd_encode"}}, {ZstdDeep, []string{"gz_zstd_deep"}}, {ZstdDecode, []string{"gz_zstd_decompress"}}} {
		for _, name := range k.names {
			if !strings.Contains(string(k.ptx), ".entry "+name) {
				t.Errorf("PTX has no entry %s", name)
			}
		}
	}
}

func TestSourceHash(t *testing.T) {
	if got := SourceHash([]byte("// gzramd-source-sha256: abc\n.version 8.0\n")); got != "abc" {
		t.Errorf("SourceHash = %q, want abc", got)
	}
	if got := SourceHash([]byte(".version 8.0\n")); got != "" {
		t.Errorf("SourceHash without header = %q, want empty", got)
	}
}
