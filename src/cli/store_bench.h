#pragma once
// `nvfp4mla store bench`: put/get throughput of the offload store's tiers against dd.
#include <CLI/CLI.hpp>

namespace nvfp4mla::cli {
void add_store_bench(CLI::App* store);
}  // namespace nvfp4mla::cli
