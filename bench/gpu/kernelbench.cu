// kernelbench checks kernels/lz4.cu against liblz4 and times its kernels
// with the data already on the GPU (CUDA events, median of several runs, on
// the whole corpus, which is larger than the L2 cache).
//
//   nvcc -O3 -arch=sm_90 -o kernelbench bench/gpu/kernelbench.cu -l:liblz4.so.1
//   ./kernelbench pages.bin [runs]
//
// It prints a markdown table and exits non-zero if any page fails to round
// trip either way (GPU -> liblz4, liblz4 -> GPU).
#include "../../kernels/lz4.cu"

#include "bench.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LZ4_compress_default(const char *src, char *dst, int srcSize, int dstCapacity);
extern "C" int LZ4_decompress_safe(const char *src, char *dst, int compressedSize, int dstCapacity);

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: kernelbench pages.bin [runs]\n");
		return 2;
	}
	int runs = argc > 2 ? atoi(argv[2]) : 10;
	FILE *f = fopen(argv[1], "rb");
	if (!f) { perror(argv[1]); return 2; }
	std::vector<uint8_t> corpus;
	{
		uint8_t buf[1 << 16];
		size_t k;
		while ((k = fread(buf, 1, sizeof buf, f)) > 0) corpus.insert(corpus.end(), buf, buf + k);
		fclose(f);
	}
	int ncorpus = (int)(corpus.size() / PAGE_SIZE);
	// Edge pages after the corpus: zeros, 0xFF, random, one byte set, a
	// short repeating pattern, and random halves.
	std::vector<uint8_t> pages(corpus.begin(), corpus.begin() + (size_t)ncorpus * PAGE_SIZE);
	uint64_t rng = 0x9E3779B97F4A7C15ull;
	auto rnd = [&]() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; };
	const int nedge = 64;
	for (int e = 0; e < nedge; e++) {
		std::vector<uint8_t> p(PAGE_SIZE, 0);
		switch (e % 8) {
		case 0: break;
		case 1: memset(p.data(), 0xFF, PAGE_SIZE); break;
		case 2: for (auto &b : p) b = (uint8_t)rnd(); break;
		case 3: p[rnd() % PAGE_SIZE] = (uint8_t)(1 + rnd() % 255); break;
		case 4: for (int i = 0; i < PAGE_SIZE; i++) p[i] = (uint8_t)("abcdefg"[i % (1 + e % 7)]); break;
		case 5: for (int i = 0; i < PAGE_SIZE / 2; i++) p[i] = (uint8_t)rnd(); break;
		case 6: for (int i = PAGE_SIZE / 2; i < PAGE_SIZE; i++) p[i] = (uint8_t)rnd(); break;
		case 7: for (int i = 0; i < PAGE_SIZE; i++) p[i] = (uint8_t)(rnd() % 4); break;
		}
		pages.insert(pages.end(), p.begin(), p.end());
	}
	const int n = ncorpus + nedge;
	const size_t bytes = (size_t)n * PAGE_SIZE;

	// liblz4 level 1 on the same pages, bounded as the CPU codec bounds it.
	std::vector<uint8_t> cpu(bytes);
	std::vector<unsigned> cpulen(n);
	size_t cpu_stored = 0, cpu_stored_corpus = 0;
	for (int i = 0; i < n; i++) {
		int r = LZ4_compress_default((const char *)&pages[(size_t)i * PAGE_SIZE], (char *)&cpu[(size_t)i * PAGE_SIZE], PAGE_SIZE, PAGE_SIZE - 1);
		cpulen[i] = r > 0 ? r : 0;
		size_t st = cpulen[i] ? cpulen[i] : PAGE_SIZE;
		cpu_stored += st;
		if (i < ncorpus) cpu_stored_corpus += st;
	}

	uint8_t *d_in, *d_scratch, *d_packed, *d_out, *d_cpu;
	unsigned *d_size, *d_off, *d_len, *d_status, *d_cpuoff, *d_cpulen;
	CK(cudaMalloc(&d_in, bytes));
	CK(cudaMalloc(&d_scratch, bytes));
	CK(cudaMalloc(&d_packed, bytes));
	CK(cudaMalloc(&d_out, bytes));
	CK(cudaMalloc(&d_cpu, bytes));
	CK(cudaMalloc(&d_size, 4));
	CK(cudaMalloc(&d_off, n * 4));
	CK(cudaMalloc(&d_len, n * 4));
	CK(cudaMalloc(&d_status, n * 4));
	CK(cudaMalloc(&d_cpuoff, n * 4));
	CK(cudaMalloc(&d_cpulen, n * 4));
	CK(cudaMemcpy(d_in, pages.data(), bytes, cudaMemcpyHostToDevice));

	const int cblocks = (n + C_WARPS - 1) / C_WARPS;
	const int dblocks = (n + D_WARPS - 1) / D_WARPS;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));

	// Correctness: poison the outputs, compress, check every page with liblz4.
	CK(cudaMemset(d_packed, 0xA5, bytes));
	CK(cudaMemset(d_scratch, 0x5A, bytes));
	CK(cudaMemset(d_off, 0xEE, n * 4));
	CK(cudaMemset(d_len, 0xEE, n * 4));
	CK(cudaMemset(d_size, 0, 4));
	gz_lz4_compress<<<cblocks, C_WARPS * 32>>>((const uint4 *)d_in, n, d_scratch, d_packed, d_size, d_off, d_len);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	unsigned packed_size;
	std::vector<unsigned> off(n), len(n);
	CK(cudaMemcpy(&packed_size, d_size, 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(off.data(), d_off, n * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(len.data(), d_len, n * 4, cudaMemcpyDeviceToHost));
	std::vector<uint8_t> packed(bytes);
	CK(cudaMemcpy(packed.data(), d_packed, packed_size, cudaMemcpyDeviceToHost));
	int bad_gpu2cpu = 0, shown = 0;
	size_t gpu_stored = 0, gpu_stored_corpus = 0;
	std::vector<uint8_t> tmp(PAGE_SIZE);
	for (int i = 0; i < n; i++) {
		const uint8_t *orig = &pages[(size_t)i * PAGE_SIZE];
		size_t st = len[i] ? len[i] : PAGE_SIZE;
		gpu_stored += st;
		if (i < ncorpus) gpu_stored_corpus += st;
		if (len[i] == 0) continue;
		bool ok = len[i] < PAGE_SIZE && off[i] % 16 == 0 && (size_t)off[i] + len[i] <= packed_size;
		if (ok) {
			int r = LZ4_decompress_safe((const char *)&packed[off[i]], (char *)tmp.data(), len[i], PAGE_SIZE);
			ok = r == PAGE_SIZE && memcmp(tmp.data(), orig, PAGE_SIZE) == 0;
		}
		if (!ok) {
			bad_gpu2cpu++;
			if (shown++ < 5) fprintf(stderr, "page %d: GPU output (len %u off %u) does not round-trip through liblz4\n", i, len[i], off[i]);
		}
	}
	// Random pages must be stored raw, zero pages must compress.
	int edge_wrong = 0;
	for (int e = 0; e < nedge; e++) {
		unsigned l = len[ncorpus + e];
		if ((e % 8 == 2 && l != 0) || ((e % 8 == 0 || e % 8 == 1 || e % 8 == 3) && (l == 0 || l > 64))) {
			edge_wrong++;
			fprintf(stderr, "edge page %d (kind %d): length %u\n", e, e % 8, l);
		}
	}

	// GPU decompression of liblz4 output and of GPU output.
	std::vector<unsigned> cpuoff(n);
	for (int i = 0; i < n; i++) cpuoff[i] = (unsigned)i * PAGE_SIZE;
	CK(cudaMemcpy(d_cpu, cpu.data(), bytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_cpuoff, cpuoff.data(), n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_cpulen, cpulen.data(), n * 4, cudaMemcpyHostToDevice));
	int bad_cpu2gpu = 0, bad_gpu2gpu = 0;
	std::vector<uint8_t> out(bytes);
	std::vector<unsigned> status(n);
	for (int pass = 0; pass < 2; pass++) {
		CK(cudaMemset(d_out, 0xC3, bytes));
		CK(cudaMemset(d_status, 0xEE, n * 4));
		if (pass == 0)
			gz_lz4_decompress<<<dblocks, D_WARPS * 32>>>(d_cpu, d_cpuoff, d_cpulen, n, (uint4 *)d_out, d_status);
		else
			gz_lz4_decompress<<<dblocks, D_WARPS * 32>>>(d_packed, d_off, d_len, n, (uint4 *)d_out, d_status);
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		CK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(status.data(), d_status, n * 4, cudaMemcpyDeviceToHost));
		const std::vector<unsigned> &L = pass == 0 ? cpulen : len;
		int bad = 0;
		for (int i = 0; i < n; i++) {
			bool ok;
			if (L[i] == 0) ok = status[i] == 2;
			else ok = status[i] == 0 && memcmp(&out[(size_t)i * PAGE_SIZE], &pages[(size_t)i * PAGE_SIZE], PAGE_SIZE) == 0;
			if (!ok) {
				if (bad < 5) fprintf(stderr, "pass %d page %d: GPU decode status %u len %u wrong\n", pass, i, status[i], L[i]);
				bad++;
			}
		}
		if (pass == 0) bad_cpu2gpu = bad; else bad_gpu2gpu = bad;
	}
	// Malformed input must be rejected, never crash: truncate every page.
	{
		std::vector<unsigned> cut(n);
		for (int i = 0; i < n; i++) cut[i] = cpulen[i] > 1 ? cpulen[i] - 1 : cpulen[i];
		CK(cudaMemcpy(d_cpulen, cut.data(), n * 4, cudaMemcpyHostToDevice));
		gz_lz4_decompress<<<dblocks, D_WARPS * 32>>>(d_cpu, d_cpuoff, d_cpulen, n, (uint4 *)d_out, d_status);
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		CK(cudaMemcpy(status.data(), d_status, n * 4, cudaMemcpyDeviceToHost));
		int accepted = 0;
		for (int i = 0; i < n; i++) if (cut[i] > 0 && status[i] == 0) accepted++;
		printf("truncated pages accepted by the GPU decoder: %d (must be 0)\n", accepted);
		if (accepted) bad_cpu2gpu++;
		CK(cudaMemcpy(d_cpulen, cpulen.data(), n * 4, cudaMemcpyHostToDevice));
	}

	// Timing on the corpus pages only (larger than L2), median of runs.
	std::vector<float> tc, td;
	for (int r = 0; r < runs + 2; r++) {
		CK(cudaMemsetAsync(d_size, 0, 4));
		CK(cudaEventRecord(e0));
		gz_lz4_compress<<<(ncorpus + C_WARPS - 1) / C_WARPS, C_WARPS * 32>>>((const uint4 *)d_in, ncorpus, d_scratch, d_packed, d_size, d_off, d_len);
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		CK(cudaGetLastError());
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		if (r >= 2) tc.push_back(ms);
	}
	for (int r = 0; r < runs + 2; r++) {
		CK(cudaEventRecord(e0));
		gz_lz4_decompress<<<(ncorpus + D_WARPS - 1) / D_WARPS, D_WARPS * 32>>>(d_packed, d_off, d_len, ncorpus, (uint4 *)d_out, d_status);
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		CK(cudaGetLastError());
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		if (r >= 2) td.push_back(ms);
	}
	const double cbytes = (double)ncorpus * PAGE_SIZE;
	double mc = median(tc), md = median(td);
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("| figure | value |\n|---|---|\n");
	printf("| device | %s (%d SMs) |\n", prop.name, prop.multiProcessorCount);
	printf("| corpus pages | %d (+%d edge pages in the checks) |\n", ncorpus, nedge);
	printf("| GPU ratio (corpus) | %.4f |\n", cbytes / gpu_stored_corpus);
	printf("| liblz4 level 1 ratio (corpus) | %.4f |\n", cbytes / cpu_stored_corpus);
	printf("| compress kernel (median of %d) | %.3f ms, %.1f GB/s |\n", runs, mc, cbytes / (mc * 1e6));
	printf("| decompress kernel (median of %d) | %.3f ms, %.1f GB/s (of output) |\n", runs, md, cbytes / (md * 1e6));
	printf("| compress min/max ms | %.3f / %.3f |\n", *std::min_element(tc.begin(), tc.end()), *std::max_element(tc.begin(), tc.end()));
	printf("| decompress min/max ms | %.3f / %.3f |\n", *std::min_element(td.begin(), td.end()), *std::max_element(td.begin(), td.end()));
	printf("| GPU->liblz4 round-trip failures | %d |\n", bad_gpu2cpu);
	printf("| liblz4->GPU round-trip failures | %d |\n", bad_cpu2gpu);
	printf("| GPU->GPU round-trip failures | %d |\n", bad_gpu2gpu);
	printf("| edge-page expectation failures | %d |\n", edge_wrong);
	(void)gpu_stored;
	(void)cpu_stored;
	return (bad_gpu2cpu || bad_cpu2gpu || bad_gpu2gpu || edge_wrong) ? 1 : 0;
}
