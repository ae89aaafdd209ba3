#!/usr/bin/env bash
# Install what is missing, build (Release; CUDA kernels when nvcc is present) and run the
# main job: `nvfp4mla eval` on its embedded default workload. Extra arguments go to eval.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target nvfp4mla_cli
exec ./build/nvfp4mla eval "$@"
