//go:build !liblz4

// Without -tags liblz4: no oracle, and Require skips.

package lz4oracle

// Available reports whether the oracle is built in.
const Available = false

const notBuilt = "lz4oracle: built without -tags liblz4; call Require first"

// CompressBound is LZ4_compressBound with the oracle built in.
func CompressBound(int) int { panic(notBuilt) }

// Compress is LZ4_compress_default with the oracle built in.
func Compress(_, _ []byte) int { panic(notBuilt) }

// Decompress is LZ4_decompress_safe with the oracle built in.
func Decompress(_, _ []byte) error { panic(notBuilt) }

// CompressPages is the compression baseline with the oracle built in.
func CompressPages([]byte, int, int) int64 { panic(notBuilt) }

// DecompressPages is the decompression baseline with the oracle built in.
func DecompressPages([]byte, []int32, []int32, int) error { panic(notBuilt) }
