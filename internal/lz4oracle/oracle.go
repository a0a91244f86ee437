// Package lz4oracle is liblz4, the reference LZ4 implementation, for tests:
// gzramd's LZ4 compressor and decoder (pkg/codec) and its GPU kernels
// (pkg/gpu) are checked against it. gzramd itself does not use liblz4, so
// the oracle is built in only with -tags liblz4, which needs liblz4-dev;
// `make test` adds the tag when lz4.h is present. Without it, Available
// is false, the functions panic, and Require skips.
package lz4oracle

import (
	"errors"
	"os"
	"testing"
)

// ErrDecode reports a block that liblz4 does not decode to exactly the
// length asked for.
var ErrDecode = errors.New("lz4oracle: liblz4 did not decode the block to the expected length")

// EnvRequired names the environment variable that, set to "required" (as
// CI does), makes Require fail rather than skip without the oracle.
const EnvRequired = "GZRAMD_LZ4_ORACLE"

// missing is the one line a test without the oracle says.
const missing = "liblz4 oracle not built in: install liblz4-dev (apt-get install liblz4-dev) and run make test, which adds -tags liblz4 when lz4.h is present"

// Require skips tb unless the oracle is built in, or fails it when
// EnvRequired is "required".
func Require(tb testing.TB) {
	tb.Helper()
	if Available {
		return
	}
	if os.Getenv(EnvRequired) == "required" {
		tb.Fatal(missing + " (" + EnvRequired + "=required)")
	}
	tb.Skip(missing)
}
