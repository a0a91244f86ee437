// zstdbench times kernels/zstd.cu with the data already on the GPU (CUDA
// events, median of 5) and prints its ratio on the pages, so that variants
// built with -D flags can be compared (-DZW_STAGE1_ONLY: stop after finding
// the sequences; -DZW_PAGE_IN_SHARED; zstd_page.h's ZP_* limits; see
// bench/results/zstd-gpu-h100-2026-11-23.md).
//
//   nvcc -O3 -arch=sm_90 -o zstdbench bench/gpu/zstdbench.cu
//   ./zstdbench pages.bin [pages]
#include "../../kernels/zstd.cu"

#include "bench.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

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
	printf("| kernel (%d pages) | ms | GB/s | ratio |\n|---|---|---|---|\n", n);
	float ms = timeit([&] {
		cudaMemset(dSize, 0, 4);
		gz_zstd_compress<<<n, 32>>>((const uint4 *)dIn, n, dScratch, dOut, dSize, dOffs, dLens);
	});
	std::vector<unsigned> lens(n);
	CK(cudaMemcpy(lens.data(), dLens, n * 4, cudaMemcpyDeviceToHost));
	double stored = 0;
	for (unsigned l : lens) stored += l ? l : ZP_PAGE;
	printf("| zstd.cu, shared memory %zu bytes a warp | %.2f | %.2f | %.4f |\n", sizeof(zp_workspace), ms, gb / ms * 1e3,
		(double)n * ZP_PAGE / stored);
	CK(cudaGetLastError());
	return 0;
}
