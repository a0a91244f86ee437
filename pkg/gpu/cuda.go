// The CUDA driver API through dlopen: the few entry points the backend uses, in cgo.

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

// Our own declarations of the few CUDA driver API types and entry points we
// use, so that gzramd builds without the CUDA toolkit. The _v2 names are the
// ones cuda.h maps the plain names to.
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef void *CUlinkState;

enum {
	GZ_CUDA_SUCCESS = 0,
	GZ_CUDA_ERROR_NOT_READY = 600,
	GZ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	GZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	GZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	GZ_CU_MEMHOSTALLOC_PORTABLE = 1,
	GZ_CU_MEMHOSTREGISTER_PORTABLE = 1,
	GZ_CU_CTX_SCHED_BLOCKING_SYNC = 4,
	GZ_CU_STREAM_NON_BLOCKING = 1,
	GZ_CU_JIT_ERROR_LOG_BUFFER = 5,
	GZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
	GZ_CU_JIT_INPUT_PTX = 1,
};

typedef struct {
	void *lib;
	CUresult (*init)(unsigned int);
	CUresult (*deviceGetCount)(int *);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*deviceGetName)(char *, int, CUdevice);
	CUresult (*deviceGetAttribute)(int *, int, CUdevice);
	CUresult (*deviceTotalMem)(size_t *, CUdevice);
	CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*primaryCtxRelease)(CUdevice);
	CUresult (*primaryCtxSetFlags)(CUdevice, unsigned int);
	CUresult (*ctxSetCurrent)(CUcontext);
	CUresult (*moduleLoadData)(CUmodule *, const void *);
	CUresult (*moduleUnload)(CUmodule);
	CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*memAlloc)(CUdeviceptr *, size_t);
	CUresult (*memFree)(CUdeviceptr);
	CUresult (*memHostAlloc)(void **, size_t, unsigned int);
	CUresult (*memFreeHost)(void *);
	CUresult (*memHostRegister)(void *, size_t, unsigned int);
	CUresult (*memHostUnregister)(void *);
	CUresult (*memcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*memcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*memsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
	CUresult (*streamCreate)(CUstream *, unsigned int);
	CUresult (*streamDestroy)(CUstream);
	CUresult (*streamSynchronize)(CUstream);
	CUresult (*streamQuery)(CUstream);
	CUresult (*launchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
		unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
	CUresult (*getErrorName)(CUresult, const char **);
	CUresult (*linkCreate)(unsigned int, int *, void **, CUlinkState *);
	CUresult (*linkAddData)(CUlinkState, int, void *, size_t, const char *, unsigned int, int *, void **);
	CUresult (*linkComplete)(CUlinkState, void **, size_t *);
	CUresult (*linkDestroy)(CUlinkState);
} gz_cuda;

// gz_cuda_open loads libcuda and resolves every entry point; it returns
// NULL and a message in err (of errlen bytes) when it cannot.
static gz_cuda *gz_cuda_open(char *err, int errlen) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen libcuda.so.1 failed");
		return NULL;
	}
	gz_cuda *d = calloc(1, sizeof *d);
	if (!d) {
		dlclose(lib);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	d->lib = lib;
#define SYM(field, name) \
	if (!(*(void **)&d->field = dlsym(lib, name))) { snprintf(err, errlen, "libcuda.so.1 has no %s", name); dlclose(lib); free(d); return NULL; }
#define SYM2(field, name, alt) \
	if (!(*(void **)&d->field = dlsym(lib, name)) && !(*(void **)&d->field = dlsym(lib, alt))) { snprintf(err, errlen, "libcuda.so.1 has no %s", name); dlclose(lib); free(d); return NULL; }
	SYM(init, "cuInit")
	SYM(deviceGetCount, "cuDeviceGetCount")
	SYM(deviceGet, "cuDeviceGet")
	SYM(deviceGetName, "cuDeviceGetName")
	SYM(deviceGetAttribute, "cuDeviceGetAttribute")
	SYM(deviceTotalMem, "cuDeviceTotalMem_v2")
	SYM(primaryCtxRetain, "cuDevicePrimaryCtxRetain")
	SYM(primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
	SYM2(primaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxSetFlags")
	SYM(ctxSetCurrent, "cuCtxSetCurrent")
	SYM(moduleLoadData, "cuModuleLoadData")
	SYM(moduleUnload, "cuModuleUnload")
	SYM(moduleGetFunction, "cuModuleGetFunction")
	SYM(memAlloc, "cuMemAlloc_v2")
	SYM(memFree, "cuMemFree_v2")
	SYM(memHostAlloc, "cuMemHostAlloc")
	SYM(memFreeHost, "cuMemFreeHost")
	SYM(memHostRegister, "cuMemHostRegister_v2")
	SYM(memHostUnregister, "cuMemHostUnregister")
	SYM(memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
	SYM(memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
	SYM(memsetD32Async, "cuMemsetD32Async")
	SYM(streamCreate, "cuStreamCreate")
	SYM(streamDestroy, "cuStreamDestroy_v2")
	SYM(streamSynchronize, "cuStreamSynchronize")
	SYM(streamQuery, "cuStreamQuery")
	SYM(launchKernel, "cuLaunchKernel")
	SYM(getErrorName, "cuGetErrorName")
	SYM(linkCreate, "cuLinkCreate_v2")
	SYM(linkAddData, "cuLinkAddData_v2")
	SYM(linkComplete, "cuLinkComplete")
	SYM(linkDestroy, "cuLinkDestroy")
#undef SYM
#undef SYM2
	return d;
}

static void gz_cuda_close(gz_cuda *d) {
	if (d) {
		dlclose(d->lib);
		free(d);
	}
}

static const char *gz_error_name(gz_cuda *d, CUresult r) {
	const char *s = NULL;
	if (d->getErrorName(r, &s) != GZ_CUDA_SUCCESS || s == NULL) return "CUDA_ERROR_UNKNOWN_CODE";
	return s;
}

static CUresult gz_init(gz_cuda *d) { return d->init(0); }
static CUresult gz_device_count(gz_cuda *d, int *n) { return d->deviceGetCount(n); }
static CUresult gz_device_get(gz_cuda *d, CUdevice *dev, int i) { return d->deviceGet(dev, i); }
static CUresult gz_device_name(gz_cuda *d, char *name, int len, CUdevice dev) { return d->deviceGetName(name, len, dev); }
static CUresult gz_device_attr(gz_cuda *d, int *v, int attr, CUdevice dev) { return d->deviceGetAttribute(v, attr, dev); }
static CUresult gz_device_mem(gz_cuda *d, size_t *v, CUdevice dev) { return d->deviceTotalMem(v, dev); }
static CUresult gz_ctx_retain(gz_cuda *d, CUcontext *c, CUdevice dev) { return d->primaryCtxRetain(c, dev); }
static CUresult gz_ctx_set_flags(gz_cuda *d, CUdevice dev, unsigned int flags) { return d->primaryCtxSetFlags(dev, flags); }
static CUresult gz_ctx_release(gz_cuda *d, CUdevice dev) { return d->primaryCtxRelease(dev); }

// Every call below makes the context current on the calling OS thread
// first: goroutines move between threads, and the setting is per thread.
#define CTX(d, c) do { CUresult r_ = (d)->ctxSetCurrent(c); if (r_ != GZ_CUDA_SUCCESS) return r_; } while (0)

static CUresult gz_module_load(gz_cuda *d, CUcontext c, CUmodule *m, const void *image) { CTX(d, c); return d->moduleLoadData(m, image); }
// gz_link compiles PTX inputs (n of them, each NUL-terminated, len[i]
// bytes with the NUL) for the context's device into one image, returned in
// *out, *outlen bytes, malloc'd (the link state owns its own copy); the
// JIT's error log goes to log.
static CUresult gz_link(gz_cuda *d, CUcontext c, void **ptx, size_t *len, int n, void **out, size_t *outlen, char *log, unsigned logsize) {
	CTX(d, c);
	int opts[] = {GZ_CU_JIT_ERROR_LOG_BUFFER, GZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[] = {log, (void *)(uintptr_t)logsize};
	CUlinkState ls;
	CUresult r = d->linkCreate(2, opts, vals, &ls);
	if (r != GZ_CUDA_SUCCESS) return r;
	for (int i = 0; i < n && r == GZ_CUDA_SUCCESS; i++) r = d->linkAddData(ls, GZ_CU_JIT_INPUT_PTX, ptx[i], len[i], "gzramd", 0, NULL, NULL);
	void *img = NULL;
	size_t size = 0;
	if (r == GZ_CUDA_SUCCESS) r = d->linkComplete(ls, &img, &size);
	if (r == GZ_CUDA_SUCCESS) {
		*out = malloc(size);
		if (*out == NULL) {
			r = 2; // CUDA_ERROR_OUT_OF_MEMORY
		} else {
			memcpy(*out, img, size);
			*outlen = size;
		}
	}
	d->linkDestroy(ls);
	return r;
}
static CUresult gz_module_unload(gz_cuda *d, CUcontext c, CUmodule m) { CTX(d, c); return d->moduleUnload(m); }
static CUresult gz_module_function(gz_cuda *d, CUcontext c, CUfunction *f, CUmodule m, const char *name) { CTX(d, c); return d->moduleGetFunction(f, m, name); }
static CUresult gz_mem_alloc(gz_cuda *d, CUcontext c, CUdeviceptr *p, size_t n) { CTX(d, c); return d->memAlloc(p, n); }
static CUresult gz_mem_free(gz_cuda *d, CUcontext c, CUdeviceptr p) { CTX(d, c); return d->memFree(p); }
static CUresult gz_host_alloc(gz_cuda *d, CUcontext c, void **p, size_t n) { CTX(d, c); return d->memHostAlloc(p, n, GZ_CU_MEMHOSTALLOC_PORTABLE); }
static CUresult gz_host_free(gz_cuda *d, CUcontext c, void *p) { CTX(d, c); return d->memFreeHost(p); }
static CUresult gz_host_register(gz_cuda *d, CUcontext c, void *p, size_t n) { CTX(d, c); return d->memHostRegister(p, n, GZ_CU_MEMHOSTREGISTER_PORTABLE); }
static CUresult gz_host_unregister(gz_cuda *d, CUcontext c, void *p) { CTX(d, c); return d->memHostUnregister(p); }
static CUresult gz_htod(gz_cuda *d, CUcontext c, CUdeviceptr dst, const void *src, size_t n, CUstream s) { CTX(d, c); return d->memcpyHtoDAsync(dst, src, n, s); }
static CUresult gz_dtoh(gz_cuda *d, CUcontext c, void *dst, CUdeviceptr src, size_t n, CUstream s) { CTX(d, c); return d->memcpyDtoHAsync(dst, src, n, s); }
static CUresult gz_memset32(gz_cuda *d, CUcontext c, CUdeviceptr dst, unsigned int v, size_t n, CUstream s) { CTX(d, c); return d->memsetD32Async(dst, v, n, s); }
static CUresult gz_stream_create(gz_cuda *d, CUcontext c, CUstream *s) { CTX(d, c); return d->streamCreate(s, GZ_CU_STREAM_NON_BLOCKING); }
static CUresult gz_stream_destroy(gz_cuda *d, CUcontext c, CUstream s) { CTX(d, c); return d->streamDestroy(s); }
static CUresult gz_stream_sync(gz_cuda *d, CUcontext c, CUstream s) { CTX(d, c); return d->streamSynchronize(s); }
static CUresult gz_stream_query(gz_cuda *d, CUcontext c, CUstream s) { CTX(d, c); return d->streamQuery(s); }
static CUresult gz_launch_compress(gz_cuda *d, CUcontext c, CUfunction f, unsigned int grid, unsigned int block, CUstream s,
		CUdeviceptr in, int n, CUdeviceptr scratch, CUdeviceptr packed, CUdeviceptr packed_size, CUdeviceptr offsets, CUdeviceptr lens) {
	CTX(d, c);
	void *args[] = {&in, &n, &scratch, &packed, &packed_size, &offsets, &lens};
	return d->launchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL);
}

static CUresult gz_launch_decompress(gz_cuda *d, CUcontext c, CUfunction f, unsigned int grid, unsigned int block, CUstream s,
		CUdeviceptr in, CUdeviceptr offsets, CUdeviceptr lens, int n, CUdeviceptr out, CUdeviceptr status) {
	CTX(d, c);
	void *args[] = {&in, &offsets, &lens, &n, &out, &status};
	return d->launchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL);
}

*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

// envWorkQueues is the driver's setting of how many hardware work queues
// (channels) a context gets.
const envWorkQueues = "CUDA_DEVICE_MAX_CONNECTIONS"

// cudaError is a failed CUDA driver call.
type cudaError struct {
	call string
	code int
	name string
}

func (e *cudaError) Error() string {
	return fmt.Sprintf("gpu: %s: %s (%d)", e.call, e.name, e.code)
}

// errNotReady is cuStreamQuery's "still running".
var errNotReady = errors.New("gpu: stream not ready")

// cuda is what Backend asks of the CUDA driver: driver in production, a
// wrapper that fails or stalls chosen calls in the GPU tests (go-nvml's
// mockable driver, without a test hook in Backend or Config).
type cuda interface {
	close()
	loadModule(ptx []byte) (module, error)
	// link compiles PTX modules into one image for loadModule.
	link(ptx ...[]byte) ([]byte, error)
	unloadModule(m module) error
	function(m module, name string) (function, error)
	memAlloc(n int) (devicePtr, error)
	memFree(p devicePtr) error
	hostAlloc(n int) ([]byte, error)
	hostFree(b []byte) error
	hostRegister(b []byte) error
	hostUnregister(b []byte) error
	htod(dst devicePtr, src []byte, s stream) error
	dtoh(dst []byte, src devicePtr, s stream) error
	memset32(dst devicePtr, v uint32, words int, s stream) error
	streamCreate() (stream, error)
	streamDestroy(s stream) error
	streamSync(s stream) error
	streamQuery(s stream) error
	launchCompress(f function, grid, block int, s stream, in devicePtr, n int, scratch, packed, packedSize, offsets, lens devicePtr) error
	launchDecompress(f function, grid, block int, s stream, in, offsets, lens devicePtr, n int, out, status devicePtr) error
}

// driver is a loaded libcuda with one device's primary context current on
// every call.
type driver struct {
	d   *C.gz_cuda
	dev C.CUdevice
	ctx C.CUcontext
}

// check turns a CUresult into an error naming the call.
func (dr *driver) check(call string, r C.CUresult) error {
	if r == C.GZ_CUDA_SUCCESS {
		return nil
	}
	if r == C.GZ_CUDA_ERROR_NOT_READY {
		return errNotReady
	}
	return &cudaError{call: call, code: int(r), name: C.GoString(C.gz_error_name(dr.d, r))}
}

// loadDriver opens libcuda, initializes it and retains the primary context
// of device index. A positive workQueues sets CUDA_DEVICE_MAX_CONNECTIONS
// first, unless the environment has it (Config.WorkQueues). Every
// failure wraps ErrUnavailable.
func loadDriver(index, workQueues int) (*driver, DeviceInfo, error) {
	var info DeviceInfo
	if _, set := os.LookupEnv(envWorkQueues); !set && workQueues > 0 {
		// Read by the driver when it initializes: cuInit below, the
		// first in the process.
		os.Setenv(envWorkQueues, strconv.Itoa(workQueues))
	}
	info.WorkQueues, _ = strconv.Atoi(os.Getenv(envWorkQueues))
	var msg [256]C.char
	d := C.gz_cuda_open(&msg[0], C.int(len(msg)))
	if d == nil {
		return nil, info, fmt.Errorf("%w: %s", ErrUnavailable, C.GoString(&msg[0]))
	}
	dr := &driver{d: d}
	fail := func(err error) (*driver, DeviceInfo, error) {
		C.gz_cuda_close(d)
		return nil, info, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := dr.check("cuInit", C.gz_init(d)); err != nil {
		return fail(err)
	}
	var n C.int
	if err := dr.check("cuDeviceGetCount", C.gz_device_count(d, &n)); err != nil {
		return fail(err)
	}
	if index < 0 || index >= int(n) {
		return fail(fmt.Errorf("no GPU with index %d (%d present)", index, int(n)))
	}
	if err := dr.check("cuDeviceGet", C.gz_device_get(d, &dr.dev, C.int(index))); err != nil {
		return fail(err)
	}
	var name [256]C.char
	if err := dr.check("cuDeviceGetName", C.gz_device_name(d, &name[0], C.int(len(name)), dr.dev)); err != nil {
		return fail(err)
	}
	info.Index = index
	info.Name = C.GoString(&name[0])
	var v C.int
	if err := dr.check("cuDeviceGetAttribute", C.gz_device_attr(d, &v, C.GZ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dr.dev)); err != nil {
		return fail(err)
	}
	info.Multiprocessors = int(v)
	if err := dr.check("cuDeviceGetAttribute", C.gz_device_attr(d, &v, C.GZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dr.dev)); err != nil {
		return fail(err)
	}
	info.ComputeMajor = int(v)
	if err := dr.check("cuDeviceGetAttribute", C.gz_device_attr(d, &v, C.GZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dr.dev)); err != nil {
		return fail(err)
	}
	info.ComputeMinor = int(v)
	var mem C.size_t
	if err := dr.check("cuDeviceTotalMem", C.gz_device_mem(d, &mem, dr.dev)); err != nil {
		return fail(err)
	}
	info.MemoryBytes = uint64(mem)
	// Waiting threads block instead of spinning (the driver's default with
	// fewer contexts than CPUs): gzramd runs at real-time priority when it
	// is swap, and a thread spinning there takes a whole CPU from
	// everything else. It fails only if the primary context is already
	// active, which in gzramd it is not; the waits then spin.
	info.BlockingSync = C.gz_ctx_set_flags(d, dr.dev, C.GZ_CU_CTX_SCHED_BLOCKING_SYNC) == C.GZ_CUDA_SUCCESS
	if err := dr.check("cuDevicePrimaryCtxRetain", C.gz_ctx_retain(d, &dr.ctx, dr.dev)); err != nil {
		return fail(err)
	}
	return dr, info, nil
}

func (dr *driver) close() {
	C.gz_ctx_release(dr.d, dr.dev)
	C.gz_cuda_close(dr.d)
}

type (
	devicePtr = C.CUdeviceptr
	stream    = C.CUstream
	function  = C.CUfunction
	module    = C.CUmodule
)

func (dr *driver) loadModule(ptx []byte) (module, error) {
	// The image must be NUL-terminated text.
	img := C.CBytes(append(append([]byte(nil), ptx...), 0))
	defer C.free(img)
	var m module
	return m, dr.check("cuModuleLoadData", C.gz_module_load(dr.d, dr.ctx, &m, img))
}

// link compiles the PTX modules for the GPU into one image.
func (dr *driver) link(ptx ...[]byte) ([]byte, error) {
	n := len(ptx)
	if n == 0 {
		return nil, errors.New("gpu: nothing to link")
	}
	srcs := (*[1 << 10]unsafe.Pointer)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))[:n:n]
	lens := (*[1 << 10]C.size_t)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.size_t(0)))))[:n:n]
	defer C.free(unsafe.Pointer(&srcs[0]))
	defer C.free(unsafe.Pointer(&lens[0]))
	for i, p := range ptx {
		srcs[i] = C.CBytes(append(append([]byte(nil), p...), 0))
		lens[i] = C.size_t(len(p) + 1)
		defer C.free(srcs[i])
	}
	var log [4096]C.char
	var img unsafe.Pointer
	var size C.size_t
	if err := dr.check("cuLinkComplete", C.gz_link(dr.d, dr.ctx, &srcs[0], &lens[0], C.int(n), &img, &size, &log[0], C.uint(len(log)))); err != nil {
		if msg := C.GoString(&log[0]); msg != "" {
			return nil, fmt.Errorf("%w: %s", err, msg)
		}
		return nil, err
	}
	defer C.free(img)
	return C.GoBytes(img, C.int(size)), nil
}

func (dr *driver) unloadModule(m module) error {
	return dr.check("cuModuleUnload", C.gz_module_unload(dr.d, dr.ctx, m))
}

func (dr *driver) function(m module, name string) (function, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f function
	return f, dr.check("cuModuleGetFunction("+name+")", C.gz_module_function(dr.d, dr.ctx, &f, m, cs))
}

func (dr *driver) memAlloc(n int) (devicePtr, error) {
	var p devicePtr
	return p, dr.check("cuMemAlloc", C.gz_mem_alloc(dr.d, dr.ctx, &p, C.size_t(n)))
}

func (dr *driver) memFree(p devicePtr) error {
	return dr.check("cuMemFree", C.gz_mem_free(dr.d, dr.ctx, p))
}

// hostAlloc returns n bytes of pinned host memory, outside the Go heap.
func (dr *driver) hostAlloc(n int) ([]byte, error) {
	var p unsafe.Pointer
	if err := dr.check("cuMemHostAlloc", C.gz_host_alloc(dr.d, dr.ctx, &p, C.size_t(n))); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func (dr *driver) hostFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return dr.check("cuMemFreeHost", C.gz_host_free(dr.d, dr.ctx, unsafe.Pointer(&b[0])))
}

// hostRegister pins b, memory the caller mapped, for DMA.
func (dr *driver) hostRegister(b []byte) error {
	return dr.check("cuMemHostRegister", C.gz_host_register(dr.d, dr.ctx, unsafe.Pointer(&b[0]), C.size_t(len(b))))
}

func (dr *driver) hostUnregister(b []byte) error {
	return dr.check("cuMemHostUnregister", C.gz_host_unregister(dr.d, dr.ctx, unsafe.Pointer(&b[0])))
}

func (dr *driver) htod(dst devicePtr, src []byte, s stream) error {
	if len(src) == 0 {
		return nil
	}
	return dr.check("cuMemcpyHtoDAsync", C.gz_htod(dr.d, dr.ctx, dst, unsafe.Pointer(&src[0]), C.size_t(len(src)), s))
}

func (dr *driver) dtoh(dst []byte, src devicePtr, s stream) error {
	if len(dst) == 0 {
		return nil
	}
	return dr.check("cuMemcpyDtoHAsync", C.gz_dtoh(dr.d, dr.ctx, unsafe.Pointer(&dst[0]), src, C.size_t(len(dst)), s))
}

func (dr *driver) memset32(dst devicePtr, v uint32, words int, s stream) error {
	return dr.check("cuMemsetD32Async", C.gz_memset32(dr.d, dr.ctx, dst, C.uint(v), C.size_t(words), s))
}

func (dr *driver) streamCreate() (stream, error) {
	var s stream
	return s, dr.check("cuStreamCreate", C.gz_stream_create(dr.d, dr.ctx, &s))
}

func (dr *driver) streamDestroy(s stream) error {
	return dr.check("cuStreamDestroy", C.gz_stream_destroy(dr.d, dr.ctx, s))
}

func (dr *driver) streamSync(s stream) error {
	return dr.check("cuStreamSynchronize", C.gz_stream_sync(dr.d, dr.ctx, s))
}

// streamQuery returns nil when all work on s is done, errNotReady while it
// runs, or the error the work ended with.
func (dr *driver) streamQuery(s stream) error {
	return dr.check("cuStreamQuery", C.gz_stream_query(dr.d, dr.ctx, s))
}

func (dr *driver) launchCompress(f function, grid, block int, s stream, in devicePtr, n int,
	scratch, packed, packedSize, offsets, lens devicePtr) error {
	return dr.check("cuLaunchKernel", C.gz_launch_compress(dr.d, dr.ctx, f, C.uint(grid), C.uint(block), s,
		in, C.int(n), scratch, packed, packedSize, offsets, lens))
}

func (dr *driver) launchDecompress(f function, grid, block int, s stream, in, offsets, lens devicePtr, n int,
	out, status devicePtr) error {
	return dr.check("cuLaunchKernel", C.gz_launch_decompress(dr.d, dr.ctx, f, C.uint(grid), C.uint(block), s,
		in, offsets, lens, C.int(n), out, status))
}
