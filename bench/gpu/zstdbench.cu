// zstdbench times kernels/zstd.cu and variants of it with the data already
// on the GPU (CUDA events, median of 5), stage by stage, to show where a
// page's time goes: the thread-per-page kernel as built (workspace in
// local memory), the same with the workspace and page in shared memory,
// and that one stopped after match finding, after the literals.
//
//   nvcc -O3 -arch=sm_90 -o zstdbench bench/gpu/zstdbench.cu
//   ./zstdbench pages.bin [pages [all]]
// (-DZW_STAGE1_ONLY: zstd.cu stops after finding the sequences; "all" adds
// the thread-a-page variants).
#include "../../kernels/zstd.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                   \
	do {                                                                                        \
		cudaError_t e_ = (x);                                                                   \
		if (e_ != cudaSuccess) {                                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(2);                                                                            \
		}                                                                                       \
	} while (0)

#ifndef S_THREADS
#define S_THREADS 2
#endif

#ifndef ZP_NO_CHAIN_MF // the thread-a-page variants need zstd_page.h's own match finder
// stop: 1 after match finding, 2 after the literals, 3 the whole frame.
template <int stop>
__global__ void __launch_bounds__(S_THREADS) k_shared(const uint8_t *in, int n, uint8_t *out, unsigned *lens) {
	__shared__ zp_workspace ws[S_THREADS];
	__shared__ uint8_t page[S_THREADS][ZP_PAGE];
	int t = threadIdx.x, pg = blockIdx.x * S_THREADS + t;
	if (pg >= n) return;
	const uint32_t *src = (const uint32_t *)(in + (size_t)pg * ZP_PAGE);
	for (int i = 0; i < ZP_PAGE / 4; i++) ((uint32_t *)page[t])[i] = src[i];
	zp_options o;
	zp_defaults(&o);
	zp_sanitize(&o);
	uint8_t *dst = out + (size_t)pg * ZP_PAGE;
	if (stop == 3) {
		lens[pg] = zp_compress_page(page[t], dst, ZP_PAGE - 1, &ws[t], &o);
		return;
	}
	int nseq = zp_find_sequences(page[t], &ws[t], &o);
	if (stop == 1) {
		lens[pg] = nseq;
		return;
	}
	int nlit = zp_gather_literals(page[t], &ws[t], nseq);
	uint8_t *op = zp_encode_literals(&ws[t], nlit, dst + 10, dst + ZP_PAGE - 1, o.huffman);
	lens[pg] = op ? (unsigned)(op - dst) : 0;
}

#endif

static float median(std::vector<float> v) {
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

template <typename F>
static float timeit(F launch) {
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	launch();
	CK(cudaDeviceSynchronize());
	std::vector<float> ms;
	for (int r = 0; r < 5; r++) {
		CK(cudaEventRecord(a));
		launch();
		CK(cudaEventRecord(b));
		CK(cudaEventSynchronize(b));
		float m;
		CK(cudaEventElapsedTime(&m, a, b));
		ms.push_back(m);
	}
	return median(ms);
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: zstdbench pages.bin [pages]\n");
		return 2;
	}
	FILE *f = fopen(argv[1], "rb");
	if (!f) return 2;
	std::vector<uint8_t> data;
	uint8_t buf[1 << 16];
	size_t got;
	while ((got = fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
	fclose(f);
	int n = (int)(data.size() / ZP_PAGE);
	if (argc > 2) n = std::min(n, atoi(argv[2]));
	uint8_t *dIn, *dOut, *dScratch;
	unsigned *dLens, *dOffs, *dSize;
	CK(cudaMalloc(&dIn, (size_t)n * ZP_PAGE));
	CK(cudaMalloc(&dOut, (size_t)n * ZP_PAGE));
	CK(cudaMalloc(&dScratch, (size_t)n * ZP_PAGE));
	CK(cudaMalloc(&dLens, n * 4));
	CK(cudaMalloc(&dOffs, n * 4));
	CK(cudaMalloc(&dSize, 4));
	CK(cudaMemcpy(dIn, data.data(), (size_t)n * ZP_PAGE, cudaMemcpyHostToDevice));
	double gb = (double)n * ZP_PAGE / 1e9;
	printf("| kernel (%d pages) | ms | GB/s |\n|---|---|---|\n", n);
	float ms = timeit([&] {
		cudaMemset(dSize, 0, 4);
		gz_zstd_compress<<<n, 32>>>((const uint4 *)dIn, n, dScratch, dOut, dSize, dOffs, dLens);
	});
	std::vector<unsigned> lens(n);
	CK(cudaMemcpy(lens.data(), dLens, n * 4, cudaMemcpyDeviceToHost));
	double stored = 0;
	for (unsigned l : lens) stored += l ? l : ZP_PAGE;
	printf("| warp a page (zstd.cu), shared memory %zu bytes | %.2f | %.2f | ratio %.4f |\n", sizeof(zp_workspace), ms, gb / ms * 1e3,
		(double)n * ZP_PAGE / stored);
#ifdef ZP_NO_CHAIN_MF
	return 0;
#else
	if (argc < 4) return 0; // the thread-a-page variants: zstdbench pages.bin N all
	int grid = (n + S_THREADS - 1) / S_THREADS;
	ms = timeit([&] { k_shared<3><<<grid, S_THREADS>>>(dIn, n, dOut, dLens); });
	printf("| thread a page, shared workspace, whole frame | %.2f | %.2f |\n", ms, gb / ms * 1e3);
	ms = timeit([&] { k_shared<1><<<grid, S_THREADS>>>(dIn, n, dOut, dLens); });
	printf("| ... match finding only | %.2f | %.2f |\n", ms, gb / ms * 1e3);
	ms = timeit([&] { k_shared<2><<<grid, S_THREADS>>>(dIn, n, dOut, dLens); });
	printf("| ... match finding and literals | %.2f | %.2f |\n", ms, gb / ms * 1e3);
	CK(cudaGetLastError());
	return 0;
#endif
}
