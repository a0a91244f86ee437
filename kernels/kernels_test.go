package kernels

import (
	"crypto/sha256"
	"encoding/hex"
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
	}{{"lz4.cu", LZ4}} {
		src, err := os.ReadFile(k.source)
		if err != nil {
			t.Fatalf("read %s: %v", k.source, err)
		}
		sum := sha256.Sum256(src)
		want := hex.EncodeToString(sum[:])
		got := SourceHash(k.ptx)
		if got == "" {
			t.Fatalf("PTX for %s records no source hash; rebuild it with build-ptx.sh", k.source)
		}
		if got != want {
			t.Errorf("PTX for %s is stale: built from source %s, source is now %s; run `make ptx` and commit kernels/*.ptx", k.source, got, want)
		}
	}
}

func TestPTXDeclaresKernels(t *testing.T) {
	for _, name := range []string{"gz_lz4_compress", "gz_lz4_decompress"} {
		if !strings.Contains(string(LZ4), ".entry "+name) {
			t.Errorf("lz4.ptx has no entry %s", name)
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
