// Package corpus loads the shared corpus of real anonymous memory pages
// (../shared/corpus/memory-pages.bin.zst from the repository root) for
// tests and benchmarks.
package corpus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
)

// PageSize is the corpus page size.
const PageSize = 4096

// EnvPath names an environment variable that overrides where the corpus is.
const EnvPath = "GZRAMD_CORPUS"

// ErrNotFound means no corpus file was found.
var ErrNotFound = errors.New("corpus: memory-pages.bin.zst not found (set " + EnvPath + " or put it in ../shared/corpus/)")

// Find returns the corpus path: $GZRAMD_CORPUS, else shared/corpus/ beside
// or above the working directory.
func Find() (string, error) {
	if p := os.Getenv(EnvPath); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("corpus: %s=%s: %w", EnvPath, p, err)
		}
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		for _, rel := range []string{"shared/corpus/memory-pages.bin.zst", "corpus/memory-pages.bin.zst"} {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNotFound
		}
		dir = parent
	}
}

// Load returns the decompressed pages of the corpus at path (Find's when
// path is empty), a whole number of pages.
func Load(path string) ([]byte, error) {
	if path == "" {
		var err error
		if path, err = Find(); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if filepath.Ext(path) == ".zst" {
		zr, err := zstd.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("corpus: %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("corpus: reading %s: %w", path, err)
	}
	if len(data) == 0 || len(data)%PageSize != 0 {
		return nil, fmt.Errorf("corpus: %s holds %d bytes, not a whole number of %d-byte pages", path, len(data), PageSize)
	}
	return data, nil
}

// StoredPages returns the pages of corpus that gzramd compresses: a page
// that repeats one 8-byte word (mostly zero) is kept as that word, in
// either tier, and is left out.
func StoredPages(corpus []byte) []byte {
	out := make([]byte, 0, len(corpus))
	for p := 0; p+PageSize <= len(corpus); p += PageSize {
		if page := corpus[p : p+PageSize]; !sameFilled(page) {
			out = append(out, page...)
		}
	}
	return out
}

func sameFilled(page []byte) bool {
	w := binary.NativeEndian.Uint64(page)
	for i := 8; i < len(page); i += 8 {
		if binary.NativeEndian.Uint64(page[i:]) != w {
			return false
		}
	}
	return true
}
