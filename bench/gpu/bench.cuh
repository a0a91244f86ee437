// What bench/gpu's programs share: failing loudly on a CUDA error, and a median.
#pragma once

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

static inline float median(std::vector<float> v) {
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}
