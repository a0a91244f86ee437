// Compiling the kernels for one GPU ahead, so that the process serving
// swap loads a finished image and never maps the driver's PTX compiler.

package gpu

import (
	"fmt"

	"github.com/gzramd/gzramd/kernels"
)

// Compile compiles algorithm's embedded PTX (and zstd.cu's kernels of
// groups, where the algorithm is not zstd) for GPU index device and
// returns the module image (a cubin) for Config.Image. The driver's PTX
// compiler is loaded into the calling process for it and stays: 20 MiB of
// libnvidia-ptxjitcompiler, locked under mlockall, and 25-30 MiB more of
// MemAvailable while it runs (H100, driver 580; bench/gpu/ctxmem.c). So
// gzramd calls it in a short-lived process of its own (`gzramd
// gpu-compile`) and hands the image to the process that serves. Every
// error wraps ErrUnavailable.
func Compile(device int, algorithm string) ([]byte, error) {
	if _, ok := batchKernels[algorithm]; !ok {
		return nil, fmt.Errorf("%w: gpu: unknown algorithm %q (want lz4 or zstd)", ErrUnavailable, algorithm)
	}
	return compile(device, "the "+algorithm+" kernels", modules(algorithm, nil))
}

// CompileDeep compiles the dense tier's kernel (kernels.ZstdDeep) for GPU
// index device and returns its image for Config.DeepImage: a module of
// its own, as DeepGroups loads it, and for the same reason as Compile.
// Every error wraps ErrUnavailable.
func CompileDeep(device int) ([]byte, error) {
	return compile(device, "the dense tier's kernel", [][]byte{kernels.ZstdDeep})
}

// compile links ptx, what it names, into one image for GPU index device.
func compile(device int, what string, ptx [][]byte) ([]byte, error) {
	dr, info, err := loadDriver(device, 0)
	if err != nil {
		return nil, err
	}
	defer dr.close()
	img, err := dr.link(ptx...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: compiling %s: %w", ErrUnavailable, info.Name, what, err)
	}
	return img, nil
}
