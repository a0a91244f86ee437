// Package lz4oracle is liblz4, the reference LZ4 implementation, for tests:
// gzramd's LZ4 compressor and decoder (pkg/codec) and its GPU kernels
// (pkg/gpu) are checked against it. gzramd itself does not use liblz4, so
// the oracle is built in only with -tags liblz4, which needs liblz4-dev;
// `make test` adds the tag when lz4.h is present. Without it, Available
// is false, the functions panic, Require skips, and Check says which
// comparisons did not run.
package lz4oracle

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// ErrDecode reports a block that liblz4 does not decode to exactly the
// length asked for.
var ErrDecode = errors.New("lz4oracle: liblz4 did not decode the block to the expected length")

// EnvRequired names the environment variable that, set to "required" (as
// CI does), makes Require fail rather than skip without the oracle.
const EnvRequired = "GZRAMD_LZ4_ORACLE"

// missing says what a test without the oracle lacks, and how to get it.
const missing = "liblz4 oracle not built in (apt-get install liblz4-dev; make test then builds with -tags liblz4)"

// Require skips tb unless the oracle is built in, or fails it when
// EnvRequired is "required".
func Require(tb testing.TB) {
	tb.Helper()
	if Available {
		return
	}
	if os.Getenv(EnvRequired) == "required" {
		tb.Fatal(testneeds.Message(testneeds.KindPackage, "liblz4-dev", missing) + " (" + EnvRequired + "=required)")
	}
	testneeds.Skip(tb, testneeds.KindPackage, "liblz4-dev", "%s", missing)
}

// checked holds the comparisons (a test and what) that Check has said did
// not run, so that a helper called a thousand times says so once.
var checked sync.Map

// Check reports whether the oracle is built in, for a test whose
// comparison with liblz4 (what) is one of its checks: without the oracle
// it logs, once per test and what, that this part did not run
// (testneeds.Part), or fails tb when EnvRequired is "required".
func Check(tb testing.TB, what string) bool {
	tb.Helper()
	if Available {
		return true
	}
	if os.Getenv(EnvRequired) == "required" {
		tb.Fatal(testneeds.Message(testneeds.KindPackage, "liblz4-dev", missing) + " (" + EnvRequired + "=required)")
	}
	type key struct {
		tb   testing.TB
		what string
	}
	if _, said := checked.LoadOrStore(key{tb, what}, true); !said {
		testneeds.Part(tb, testneeds.KindPackage, "liblz4-dev", "%s: %s", missing, what)
	}
	return false
}
