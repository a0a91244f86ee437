// zstdbench times kernels/zstd.cu with the data already on the GPU (CUDA
// events, median of 10): its two kernels together, and each alone, and
// prints its ratio on the pages, so that variants built with -D flags can
// be compared (zstd_page.h's ZP_* limits; -DZW_PROFILE: where lane 0's
// cycles go; see bench/results/zstd-gpu-h100-2026-11-23.md).
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
	for (int r = 0; r < 10; r++) {
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
	CK(cudaMalloc(&dScratch, (size_t)n * ZW_SCRATCH_PAGE));
	CK(cudaMalloc(&dLens, n * 4));
	CK(cudaMalloc(&dOffs, n * 4));
	CK(cudaMalloc(&dSize, 4));
	CK(cudaMemcpy(dIn, data.data(), (size_t)n * ZP_PAGE, cudaMemcpyHostToDevice));
	double gb = (double)n * ZP_PAGE / 1e9;
	auto parse = [&] {
		gz_zstd_parse<<<(n + ZW_PARSE_WARPS - 1) / ZW_PARSE_WARPS, 32 * ZW_PARSE_WARPS>>>(
			(const uint4 *)dIn, n, dScratch, dOut, dSize, dOffs, dLens);
	};
	// ZSTDBENCH_PAD: bytes of shared memory added to each encode block, to
	// see how its speed follows the warps an SM.
	const int pad = getenv("ZSTDBENCH_PAD") ? atoi(getenv("ZSTDBENCH_PAD")) : 0;
	auto encode = [&] {
		cudaMemset(dSize, 0, 4);
		gz_zstd_encode<<<n, 32, pad>>>((const uint4 *)dIn, n, dScratch, dOut, dSize, dOffs, dLens);
	};
	printf("| kernels (%d pages) | ms | GB/s | ratio |\n|---|---|---|---|\n", n);
	const float msParse = timeit(parse), msEncode = timeit(encode);
	float ms = timeit([&] {
		parse();
		encode();
	});
	// As the daemon runs them: batches of 1024 pages, four in flight on
	// their own streams, so that one batch's parse can run beside
	// another's encode.
	const int batch = 1024, nstreams = 4;
	cudaStream_t streams[nstreams];
	for (auto &st : streams) CK(cudaStreamCreate(&st));
	const float msPiped = timeit([&] {
		cudaMemset(dSize, 0, 4);
		for (int lo = 0, k = 0; lo < n; lo += batch, k++) {
			const int nb = std::min(batch, n - lo);
			cudaStream_t st = streams[k % nstreams];
			const uint4 *in = (const uint4 *)(dIn + (size_t)lo * ZP_PAGE);
			uint8_t *scratch = dScratch + (size_t)lo * ZW_SCRATCH_PAGE;
			gz_zstd_parse<<<(nb + ZW_PARSE_WARPS - 1) / ZW_PARSE_WARPS, 32 * ZW_PARSE_WARPS, 0, st>>>(
				in, nb, scratch, dOut, dSize, dOffs + lo, dLens + lo);
			gz_zstd_encode<<<nb, 32, 0, st>>>(in, nb, scratch, dOut, dSize, dOffs + lo, dLens + lo);
		}
	});
	CK(cudaGetLastError());
	std::vector<unsigned> lens(n);
	CK(cudaMemcpy(lens.data(), dLens, n * 4, cudaMemcpyDeviceToHost));
	double stored = 0;
	for (unsigned l : lens) stored += l ? l : ZP_PAGE;
	printf("| zstd.cu, both (encode's workspace %zu bytes a warp) | %.2f | %.2f | %.4f |\n", sizeof(zp_workspace), ms,
		gb / ms * 1e3, (double)n * ZP_PAGE / stored);
	printf("| gz_zstd_parse | %.2f | %.2f | |\n| gz_zstd_encode%s | %.2f | %.2f | |\n", msParse, gb / msParse * 1e3,
		pad ? " (padded)" : "", msEncode, gb / msEncode * 1e3);
	printf("| both, batches of %d pages, %d in flight | %.2f | %.2f | |\n", batch, nstreams, msPiped, gb / msPiped * 1e3);
	if (pad) printf("\nencode blocks padded with %d bytes of shared memory\n", pad);
	CK(cudaGetLastError());
#ifdef ZW_PROFILE
	// One more pass with the counters cleared: lane 0's cycles a step.
	unsigned long long prof[32] = {0};
	CK(cudaMemcpyToSymbol(zw_prof, prof, sizeof prof));
	parse();
	encode();
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpyFromSymbol(prof, zw_prof, sizeof prof));
	const char *step[32] = {0};
	step[1] = "parse: setup (table, same-byte test)";
	step[2] = "parse: sequences";
	step[3] = "encode: literals read, codes";
	step[4] = "literal histogram";
	step[5] = "literals section (plan rest, Huffman streams)";
	step[6] = "finish literals, block header";
	step[7] = "pack";
	step[10] = "plan: distinct symbols";
	step[11] = "plan: sort";
	step[12] = "plan: depth tries (estimates)";
	step[16] = "plan: unlimited code lengths (lane 0)";
	step[13] = "plan: exact plan";
	step[14] = "plan: canonical codes";
	step[15] = "plan: tree, stream sizes";
	step[20] = "sequences: codes counted";
	step[21] = "sequences: table modes";
	step[22] = "sequences: tables built";
	step[23] = "sequences: bitstream";
	step[24] = "sequences: state chains (3 lanes)";
	unsigned long long total = 0;
	for (int i = 1; i < 30; i++) total += prof[i];
	printf("\n| step (lane 0) | cycles a page | share |\n|---|---|---|\n");
	for (int i = 1; i < 30; i++)
		if (prof[i]) printf("| %d %s | %.0f | %.1f %% |\n", i, step[i] ? step[i] : "?", (double)prof[i] / n, 100.0 * prof[i] / total);
	printf("\nsequences a page %.1f, literals a page %.1f\n", (double)prof[30] / n, (double)prof[31] / n);
#endif
	return 0;
}
