// ctxmem: what each step of setting up the CUDA driver costs in host
// memory, for the footprint benchmark (bench/footprint.sh) and for
// deciding what gzramd's GPU backend does (docs/DESIGN.md, "Footprint").
//
// It opens libcuda with dlopen, as gzramd does, so it builds with a C
// compiler alone (no CUDA toolkit):
//   cc -O2 -o ctxmem bench/gpu/ctxmem.c -ldl
//
// After each step it prints the machine's MemAvailable drop since the
// start and its own resident, anonymous, file, shared and locked memory
// (smaps_rollup), and whether the PTX JIT compiler is mapped:
//   ctxmem [--mlock] [--create] [--flags N] [--limits] [--ptx FILE]...
//          [--cubin FILE]... [--link-out FILE] [--streams N] [--events N]
//          [--pinned BYTES] [--device N] [--maps]
// --mlock      mlockall(MCL_CURRENT|MCL_FUTURE|MCL_ONFAULT) first, as gzramd
// --create     cuCtxCreate in place of the primary context
// --flags N    context flags (4: CU_CTX_SCHED_BLOCKING_SYNC, gzramd's)
// --limits     stack, printf FIFO and malloc heap at their minimum
// --ptx FILE   cuModuleLoadData of a PTX file (the driver JITs it)
// --link-out F JIT every --ptx through cuLink and write the cubin to F
//              (with one --ptx), reporting the time it took
// --cubin FILE cuModuleLoadData of a cubin: no JIT
// --launch     look up every .entry of the loaded PTX modules (forces
//              lazy loading to load them)
// --entry NAME look up NAME in each loaded cubin (likewise)
// --maps       at the end, resident memory by mapping
// The environment's CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS
// apply as usual.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUlinkState;
typedef unsigned long long CUdeviceptr;

static struct {
	CUresult (*init)(unsigned);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*primaryCtxSetFlags)(CUdevice, unsigned);
	CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*ctxCreate)(CUcontext *, unsigned, CUdevice);
	CUresult (*ctxSetCurrent)(CUcontext);
	CUresult (*ctxSetLimit)(int, size_t);
	CUresult (*moduleLoadData)(CUmodule *, const void *);
	CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*linkCreate)(unsigned, int *, void **, CUlinkState *);
	CUresult (*linkAddData)(CUlinkState, int, void *, size_t, const char *, unsigned, int *, void **);
	CUresult (*linkComplete)(CUlinkState, void **, size_t *);
	CUresult (*linkDestroy)(CUlinkState);
	CUresult (*streamCreate)(CUstream *, unsigned);
	CUresult (*eventCreate)(CUevent *, unsigned);
	CUresult (*memHostAlloc)(void **, size_t, unsigned);
	CUresult (*driverGetVersion)(int *);
} cu;

static long kib(const char *file, const char *key) {
	FILE *f = fopen(file, "r");
	if (!f) return -1;
	char line[256];
	long v = -1;
	size_t n = strlen(key);
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			v = atol(line + n + 1);
			break;
		}
	fclose(f);
	return v;
}

static int jit_mapped(void) {
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;
	while (f && fgets(line, sizeof line, f))
		if (strstr(line, "ptxjitcompiler")) found = 1;
	if (f) fclose(f);
	return found;
}

static long start_avail;

static void report(const char *step) {
	const char *r = "/proc/self/smaps_rollup";
	printf("%-28s avail_drop=%6ld rss=%6ld anon=%6ld file=%6ld shmem=%6ld locked=%6ld jit=%d (KiB)\n", step,
	       start_avail - kib("/proc/meminfo", "MemAvailable"), kib(r, "Rss"), kib(r, "Anonymous"), kib(r, "Pss_File"),
	       kib(r, "Pss_Shmem"), kib(r, "Locked"), jit_mapped());
	fflush(stdout);
}

static void check(const char *what, CUresult r) {
	if (r != 0) {
		fprintf(stderr, "ctxmem: %s failed: CUDA error %d\n", what, r);
		exit(1);
	}
}

static char *slurp(const char *path, size_t *len) {
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(n + 1);
	if (fread(b, 1, n, f) != (size_t)n) exit(1);
	b[n] = 0;
	fclose(f);
	*len = n;
	return b;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// The .entry names of a PTX text, for --launch.
static void lookup_entries(CUmodule m, const char *ptx) {
	for (const char *p = ptx; (p = strstr(p, ".entry ")); p += 7) {
		char name[256];
		if (sscanf(p + 7, "%255[A-Za-z0-9_]", name) == 1) {
			CUfunction f;
			check(name, cu.moduleGetFunction(&f, m, name));
		}
	}
}

static void maps_by_path(void) {
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512], path[256] = "";
	struct { char path[256]; long rss; } agg[256];
	int n = 0;
	while (f && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		char perms[8];
		int off = 0;
		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) >= 3 && off > 0) {
			char *p = line + off;
			p[strcspn(p, "\n")] = 0;
			snprintf(path, sizeof path, "%s", *p ? p : "[anon]");
			continue;
		}
		long v;
		if (sscanf(line, "Rss: %ld kB", &v) == 1 && v > 0) {
			int i = 0;
			while (i < n && strcmp(agg[i].path, path)) i++;
			if (i == n && n < 256) snprintf(agg[n++].path, 256, "%s", path);
			if (i < 256) agg[i].rss += v;
		}
	}
	if (f) fclose(f);
	for (int i = 0; i < n; i++)
		if (agg[i].rss >= 256) printf("  map %8ld KiB %s\n", agg[i].rss, agg[i].path);
}

int main(int argc, char **argv) {
	int mlock_all = 0, create = 0, limits = 0, launch = 0, streams = 0, events = 0, maps = 0, device = 0;
	unsigned flags = 0;
	long pinned = 0;
	const char *ptx[8], *cubin[8], *entry[8], *link_out = NULL;
	int nptx = 0, ncubin = 0, nentry = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--mlock")) mlock_all = 1;
		else if (!strcmp(a, "--create")) create = 1;
		else if (!strcmp(a, "--limits")) limits = 1;
		else if (!strcmp(a, "--launch")) launch = 1;
		else if (!strcmp(a, "--maps")) maps = 1;
		else if (!strcmp(a, "--flags") && v) flags = atoi(v), i++;
		else if (!strcmp(a, "--device") && v) device = atoi(v), i++;
		else if (!strcmp(a, "--streams") && v) streams = atoi(v), i++;
		else if (!strcmp(a, "--events") && v) events = atoi(v), i++;
		else if (!strcmp(a, "--pinned") && v) pinned = atol(v), i++;
		else if (!strcmp(a, "--ptx") && v && nptx < 8) ptx[nptx++] = v, i++;
		else if (!strcmp(a, "--cubin") && v && ncubin < 8) cubin[ncubin++] = v, i++;
		else if (!strcmp(a, "--link-out") && v) link_out = v, i++;
		else if (!strcmp(a, "--entry") && v && nentry < 8) entry[nentry++] = v, i++;
		else {
			fprintf(stderr, "ctxmem: bad argument %s (see the comment at the top of ctxmem.c)\n", a);
			return 2;
		}
	}
	start_avail = kib("/proc/meminfo", "MemAvailable");
	report("start");
	if (mlock_all) {
		if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)) perror("mlockall");
		report("mlockall");
	}
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "ctxmem: %s\n", dlerror());
		return 1;
	}
#define SYM(f, n) if (!(*(void **)&cu.f = dlsym(lib, n))) { fprintf(stderr, "ctxmem: no %s\n", n); return 1; }
	SYM(init, "cuInit") SYM(deviceGet, "cuDeviceGet") SYM(primaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags_v2")
	SYM(primaryCtxRetain, "cuDevicePrimaryCtxRetain") SYM(ctxCreate, "cuCtxCreate_v2")
	SYM(ctxSetCurrent, "cuCtxSetCurrent") SYM(ctxSetLimit, "cuCtxSetLimit") SYM(moduleLoadData, "cuModuleLoadData")
	SYM(moduleGetFunction, "cuModuleGetFunction") SYM(linkCreate, "cuLinkCreate_v2")
	SYM(linkAddData, "cuLinkAddData_v2") SYM(linkComplete, "cuLinkComplete") SYM(linkDestroy, "cuLinkDestroy")
	SYM(streamCreate, "cuStreamCreate") SYM(eventCreate, "cuEventCreate") SYM(memHostAlloc, "cuMemHostAlloc")
	SYM(driverGetVersion, "cuDriverGetVersion")
	report("dlopen libcuda");
	check("cuInit", cu.init(0));
	int ver = 0;
	cu.driverGetVersion(&ver);
	report("cuInit");
	CUdevice dev;
	check("cuDeviceGet", cu.deviceGet(&dev, device));
	CUcontext ctx;
	if (create) {
		check("cuCtxCreate", cu.ctxCreate(&ctx, flags, dev));
	} else {
		check("cuDevicePrimaryCtxSetFlags", cu.primaryCtxSetFlags(dev, flags));
		check("cuDevicePrimaryCtxRetain", cu.primaryCtxRetain(&ctx, dev));
		check("cuCtxSetCurrent", cu.ctxSetCurrent(ctx));
	}
	report(create ? "cuCtxCreate" : "primary context");
	if (limits) {
		// CU_LIMIT_STACK_SIZE 0, CU_LIMIT_PRINTF_FIFO_SIZE 1, CU_LIMIT_MALLOC_HEAP_SIZE 2
		check("stack limit", cu.ctxSetLimit(0, 1024));
		check("printf limit", cu.ctxSetLimit(1, 4096));
		check("heap limit", cu.ctxSetLimit(2, 4096));
		report("limits at minimum");
	}
	for (int i = 0; i < nptx; i++) {
		size_t len;
		char *text = slurp(ptx[i], &len);
		double t0 = now();
		if (link_out) {
			CUlinkState ls;
			check("cuLinkCreate", cu.linkCreate(0, NULL, NULL, &ls));
			// CU_JIT_INPUT_PTX is 1
			check("cuLinkAddData", cu.linkAddData(ls, 1, text, len + 1, ptx[i], 0, NULL, NULL));
			void *img;
			size_t n;
			check("cuLinkComplete", cu.linkComplete(ls, &img, &n));
			FILE *o = fopen(link_out, "wb");
			if (!o || fwrite(img, 1, n, o) != n || fclose(o)) {
				perror(link_out);
				return 1;
			}
			cu.linkDestroy(ls);
			printf("linked %s to %s: %zu bytes in %.3f s\n", ptx[i], link_out, n, now() - t0);
		} else {
			CUmodule m;
			check("cuModuleLoadData(ptx)", cu.moduleLoadData(&m, text));
			if (launch) lookup_entries(m, text);
			printf("loaded %s in %.3f s\n", ptx[i], now() - t0);
		}
		char step[64];
		snprintf(step, sizeof step, "%s ptx %d", link_out ? "linked" : "loaded", i);
		report(step);
	}
	for (int i = 0; i < ncubin; i++) {
		size_t len;
		char *img = slurp(cubin[i], &len);
		double t0 = now();
		CUmodule m;
		check("cuModuleLoadData(cubin)", cu.moduleLoadData(&m, img));
		for (int j = 0; j < nentry; j++) {
			CUfunction f;
			if (cu.moduleGetFunction(&f, m, entry[j]) == 0) printf("found %s\n", entry[j]);
		}
		printf("loaded %s in %.3f s\n", cubin[i], now() - t0);
		report("loaded cubin");
	}
	for (int i = 0; i < streams; i++) {
		CUstream s;
		check("cuStreamCreate", cu.streamCreate(&s, 1));
	}
	if (streams) report("streams");
	for (int i = 0; i < events; i++) {
		CUevent e;
		check("cuEventCreate", cu.eventCreate(&e, 2)); // CU_EVENT_DISABLE_TIMING
	}
	if (events) report("events");
	if (pinned) {
		void *p;
		check("cuMemHostAlloc", cu.memHostAlloc(&p, pinned, 1));
		report("pinned");
	}
	printf("driver %d\n", ver);
	if (maps) maps_by_path();
	return 0;
}
