#pragma once
// Shared plumbing of the C ABI (include/nvfp4mla/c_api.h): exceptions become status codes and a
// thread-local message, formats become validated configurations.
#include <stdexcept>
#include <string>

#include "nvfp4mla/c_api.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "nvfp4mla/cuda/cache_write.h"
#endif

namespace nvfp4mla::capi {

// A CUDA entry point called in a build without CUDA.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void set_last_error(const std::string& message);
const char* last_error();

// Runs `body`, turning every exception into a status code and nvfp4mla_last_error().
template <class Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    return NVFP4MLA_OK;
  } catch (const Unsupported& e) {
    set_last_error(e.what());
    return NVFP4MLA_ERROR_UNSUPPORTED;
  } catch (const Error& e) {
    set_last_error(e.what());
    return NVFP4MLA_ERROR;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return NVFP4MLA_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return NVFP4MLA_ERROR_INTERNAL;
  }
}

// Keeps `text` in thread-local storage until the next hand-out on this thread.
const char* hand_out(std::string text);

// Throws Error naming `what` when `p` is null.
void require(const void* p, const char* what);

// The configuration a format struct describes, validated by FormatConfig::create (in static mode
// with the struct's layer scale as a bare scale).
FormatConfig config_of(const nvfp4mla_format* format);
RecordSpec spec_of(const nvfp4mla_format* format);
nvfp4mla_format format_of(const RecordSpec& spec, float layer_scale);

// SparseMlaArgs of a C problem description; throws Error for a null description.
SparseMlaArgs attention_args(const nvfp4mla_attention* problem, float layer_scale);

// Calls fn(In{}) with In the C++ type of the input type code.
template <class Fn>
void with_input_type(int32_t input_type, Fn&& fn) {
  switch (input_type) {
    case NVFP4MLA_INPUT_BF16: return fn(Bf16Bits{});
    case NVFP4MLA_INPUT_FP16: return fn(Fp16Bits{});
    case NVFP4MLA_INPUT_F32: return fn(float{});
    default: throw Error("unknown input type code " + std::to_string(input_type) + ": use bf16, fp16 or f32");
  }
}

inline void check_count(int64_t n, const char* what) {
  if (n < 0) throw Error(std::string(what) + ": negative count " + std::to_string(n));
}

#if defined(NVFP4MLA_WITH_CUDA)
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Makes `device` current for the call, as the caller's framework does for its own kernels.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    else previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

inline cudaStream_t stream_of(void* stream) { return static_cast<cudaStream_t>(stream); }
inline auto* counter_of(uint64_t* p) { return reinterpret_cast<unsigned long long*>(p); }

inline cuda::InputType input_type_of(int32_t code) {
  if (code < NVFP4MLA_INPUT_BF16 || code > NVFP4MLA_INPUT_F32)
    throw Error("unknown input type code " + std::to_string(code) + ": use bf16, fp16 or f32");
  return static_cast<cuda::InputType>(code);
}
#else
// What every CUDA entry point of a build without CUDA throws.
[[noreturn]] inline void no_cuda(const char* what) {
  throw Unsupported(std::string(what) + ": this nvfp4mla library was built without CUDA (rebuild with nvcc present, "
                                        "-DNVFP4MLA_CUDA=ON)");
}
#endif

}  // namespace nvfp4mla::capi
