//go:build ignore

// unzstd decodes a zstd file to stdout; the device machine has no zstd
// tool, so bench/gpu/run.sh uses a copy of this built on the host.
package main

import (
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

func main() {
	f, err := os.Open(os.Args[1])
	if err != nil {
		panic(err)
	}
	d, err := zstd.NewReader(f)
	if err != nil {
		panic(err)
	}
	if _, err := io.Copy(os.Stdout, d); err != nil {
		panic(err)
	}
}
