// Command gzramd is a compressed RAM block device served over NBD, for use
// as swap: pages are compressed in batches (on the GPU when there is one)
// and kept in memory.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/gzramd/gzramd/pkg/serving"
)

func main() {
	// The heap profiler allocates its buckets on sampled allocations, at
	// any moment; a swap daemon must not fault in new memory it does not
	// need (a freezing guest showed exactly that in its stack dump).
	runtime.MemProfileRate = 0
	root := &cobra.Command{
		Use:   "gzramd",
		Short: "GPU-compressed RAM block device for swap, served over NBD",
		Long: `gzramd keeps a block device in compressed RAM, like the kernel's zram, and
serves it over the NBD protocol. The kernel's NBD client attaches it as
/dev/nbdN and uses it as swap; writes are compressed in large batches on the
GPU when one is present and on the CPU otherwise, as standard LZ4 blocks
(--algorithm lz4, the default) or zstd frames (--algorithm zstd, which
stores 1.43x what lz4 stores in the same memory: ratio 3.38 against 2.36 on
the corpus of real memory pages; a swap-in costs more CPU), which liblz4
and libzstd decode.`,
		// cobra prints it as the version command does. No version
		// template: a text/template makes the linker keep every method
		// of every type (2.5 MB more code, all of it locked in memory).
		Version:       buildVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	root.AddCommand(newServeCmd(), newStatusCmd(), newBenchCmd(), newVersionCmd(), newGPUCompileCmd())
	if err := root.Execute(); err != nil {
		var status serving.ExitStatus
		if errors.As(err, &status) {
			os.Exit(int(status))
		}
		fmt.Fprintln(os.Stderr, "gzramd:", err)
		os.Exit(exitCode(err))
	}
}
