// `gzramd gpu-compile`, which the serving process runs to compile the GPU
// kernels in a process of its own (serving.compileKernels).

package main

import (
	"github.com/spf13/cobra"

	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// newGPUCompileCmd is `gzramd gpu-compile`, which `gzramd serve` runs to
// compile the GPU kernels in a process of its own.
func newGPUCompileCmd() *cobra.Command {
	var device int
	var algorithm string
	var dense bool
	cmd := &cobra.Command{
		Use:    "gpu-compile",
		Short:  "Compile the GPU kernels for one GPU and write the image to standard output (gzramd serve runs it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A serving process that took over runs this while it serves,
			// maybe at real-time priority, which a compiler must not
			// inherit.
			swapsafe.DropRealtime() //nolint:errcheck // not real-time to begin with, most often
			var img []byte
			var err error
			if dense {
				img, err = gpu.CompileDeep(device)
			} else {
				img, err = gpu.Compile(device, algorithm)
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(img)
			return err
		},
	}
	cmd.Flags().IntVar(&device, "gpu-device", 0, "CUDA device index")
	cmd.Flags().StringVar(&algorithm, "algorithm", "lz4", "lz4 or zstd")
	cmd.Flags().BoolVar(&dense, "dense", false, "compile the dense tier's kernel instead of the algorithm's (a module of its own)")
	return cmd
}
