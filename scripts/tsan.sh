#!/usr/bin/env bash
# Builds the CPU code with ThreadSanitizer and runs the offload store tests (the concurrent
# part of the library). Usage: scripts/tsan.sh [extra gtest filter, default Offload*]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
dir=build-tsan
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNVFP4MLA_CUDA=OFF -DNVFP4MLA_TSAN=ON >/dev/null
cmake --build "$dir" -j "$(nproc)" --target nvfp4mla_unit_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  "$dir/tests/nvfp4mla_unit_tests" --gtest_filter="${1:-Offload*}"
