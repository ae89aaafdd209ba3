#!/usr/bin/env bash
# Profiling variants in seconds instead of a whole configure-and-build: recompiles the library
# objects whose source path matches PATTERN with extra compile FLAGS (for example
# -DNVFP4MLA_DECODE_TRACE=1 or -DNVFP4MLA_DECODE_STAGE_SKIP=64, CMakeLists.txt), puts them into a
# copy of the build's libnvfp4mla.a and links the CLI (and, with --tests, the GPU test binary)
# against that copy into OUT. The build directory itself is left as it was: its objects, archive
# and ninja state are not touched, so a later `ninja` does not rebuild anything.
# Usage: scripts/variant_build.sh [--tests] BUILD_DIR OUT "FLAGS" PATTERN...
#   scripts/variant_build.sh build-dev /tmp/trace "-DNVFP4MLA_DECODE_TRACE=1" sm90_ws_pair_wide_nvfp4_fp8rope_dynamic
set -euo pipefail
tests=0
if [[ "${1:-}" == "--tests" ]]; then tests=1; shift; fi
if (($# < 4)); then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
build=$(realpath "$1") out=$(realpath -m "$2") flags=$3
shift 3
mkdir -p "$out/objects"
cp "$build/libnvfp4mla.a" "$out/libnvfp4mla.a"
cd "$build"
mapfile -t objects < <(ninja -t targets all | sed -n 's|^\(CMakeFiles/nvfp4mla\.dir/.*\.o\): .*|\1|p')
compiled=0
for object in "${objects[@]}"; do
  for pattern in "$@"; do
    [[ "$object" == *"$pattern"* ]] || continue
    command=$(ninja -t commands "$object" | tail -1)
    name=$(basename "$object")
    # The same command with the flags, writing the object and its depfile under OUT.
    command=${command/ -c / $flags -c }
    command=${command/-o $object/-o $out/objects/$name}
    command=${command/-MF $object.d/-MF $out/objects/$name.d}
    [[ "$command" == *"$out/objects/$name "* || "$command" == *"$out/objects/$name" ]] || { echo "variant_build: cannot redirect $object" >&2; exit 1; }
    echo "variant_build: $name $flags"
    (eval "$command")
    ar r "$out/libnvfp4mla.a" "$out/objects/$name"  # members are named by their basenames
    compiled=$((compiled + 1))
    break
  done
done
((compiled > 0)) || { echo "variant_build: no object of libnvfp4mla matches $*" >&2; exit 1; }
# Link a target of the build with the copied archive in place of the build's.
link() {
  local command
  command=$(ninja -t commands "$1" | tail -1)
  command=${command//libnvfp4mla.a/$out/libnvfp4mla.a}
  command=${command/-o $1 /-o $out/$(basename "$1") }
  (eval "$command")
}
link nvfp4mla
((tests)) && link tests/nvfp4mla_gpu_tests
echo "variant_build: $compiled objects; $out/nvfp4mla$( ((tests)) && echo " and $out/nvfp4mla_gpu_tests")"
