#pragma once
// NVFP4MLA_HD marks functions that compile both for the host and, under nvcc, for the device.
#if defined(__CUDACC__)
#define NVFP4MLA_HD __host__ __device__ __forceinline__
#else
#define NVFP4MLA_HD inline
#endif
