#!/usr/bin/env bash
# Build and run the test suites. GPU tests (ctest label "gpu") skip cleanly without a device.
#   scripts/test.sh              release build (CUDA when nvcc is present), all tests, then the
#                                Python package: registered for `import nvfp4mla`, its tests run
#   scripts/test.sh --sanitize   CPU-only build under ASan + UBSan, CPU tests (the Python package's
#                                too, over the sanitized C ABI)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
if [[ "${1:-}" == "--sanitize" ]]; then
  dir=build-asan
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNVFP4MLA_CUDA=OFF -DNVFP4MLA_SANITIZE=ON >/dev/null
  cmake --build "$dir" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" -L cpu --output-on-failure -j "$jobs"
  bash scripts/python-package.sh --sanitize
else
  dir=build
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$dir" -j "$jobs"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs"
  bash scripts/python-package.sh
fi
