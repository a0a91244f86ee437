// Package kernels holds the CUDA kernels of gzramd as PTX, built from the
// .cu sources beside it by build-ptx.sh (`make ptx`, which needs nvcc) and
// committed, so that building gzramd needs no CUDA toolkit: the driver
// compiles the PTX for the GPU at load time.
package kernels

import (
	"bufio"
	"bytes"
	_ "embed"
	"strings"
	"unsafe"
)

// The PTX is embedded as strings, in the binary's read-only data, and
// each variable below views its string's bytes: read only, never to be
// written. Embedded as []byte it would be writable data, which mlockall
// copies into each process that locks it (1.8 MB, in the supervisor, the
// serving process and the standby: issue 39); read only, every process
// maps the one copy in the page cache.
func readOnly(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

//go:embed lz4.ptx
var lz4PTX string

// LZ4 is the PTX of lz4.cu: gz_lz4_compress and gz_lz4_decompress.
var LZ4 = readOnly(lz4PTX)

//go:embed zstd.ptx
var zstdPTX string

// Zstd is the PTX of zstd.cu: gz_zstd_parse, then gz_zstd_encode, which
// writes zstd frames (zstd_page.h); and gz_zstd_parse_groups,
// gz_zstd_encode_blocks and gz_zstd_pack_groups, which write a frame a
// group of pages.
var Zstd = readOnly(zstdPTX)

// sourceHashPrefix starts the first line of every generated PTX file.
const sourceHashPrefix = "// gzramd-source-sha256: "

// SourceHash returns the sha256 (hex) of the .cu source that ptx was built
// from, as build-ptx.sh recorded it, or "" if ptx carries none.
func SourceHash(ptx []byte) string {
	line, _, _ := bufio.NewReader(bytes.NewReader(ptx)).ReadLine()
	s, ok := strings.CutPrefix(string(line), sourceHashPrefix)
	if !ok {
		return ""
	}
	return strings.TrimSpace(s)
}

//go:embed zstd_dec.ptx
var zstdDecodePTX string

// ZstdDecode is the PTX of zstd_dec.cu: gz_zstd_decompress, which decodes
// zstd pages (pkg/codec/zstddec_core.h, the host's decoder) for the dense
// tier's recompression, as lz4.cu's gz_lz4_decompress decodes LZ4 pages.
var ZstdDecode = readOnly(zstdDecodePTX)

//go:embed zstd_deep.ptx
var zstdDeepPTX string

// ZstdDeep is the PTX of zstd_deep.cu: gz_zstd_deep, which writes frames
// of several pages compressed hard (zstd_deep.h), a warp a frame, byte for
// byte as internal/zstddeep does on the host (30.7 MB/s on an H100 with
// 1,024 frames a launch: bench/results/dense-two-ways-h100-2026-12-07.md).
// The dense tier's GPU (gpu.DeepGroups) runs it.
var ZstdDeep = readOnly(zstdDeepPTX)

// All is the PTX of every kernel. `gzramd gpu-compile` reads it, to
// compile the image the serving process loads; a serving process reads it
// only as it opens the GPU where the driver refused that image. So it is
// left out of the code a serving process locks in memory (1.8 MB;
// swapsafe.Options.Unlocked).
func All() [][]byte { return [][]byte{LZ4, Zstd, ZstdDecode, ZstdDeep} }
