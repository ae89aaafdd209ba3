#pragma once
// Shared plumbing of the C ABI (include/nvfp4mla/c_api.h): exceptions become status codes and a
// thread-local message, formats become validated configurations.
#include <stdexcept>
#include <string>

#include "nvfp4mla/c_api.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/sparse_mla.h"

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

}  // namespace nvfp4mla::capi
