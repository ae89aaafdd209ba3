#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, build-fuzz/) and runs them (docs/FUZZING.md).
#   scripts/fuzz.sh                    regression (CI): each target replays fuzz/corpus/<target>
#   scripts/fuzz.sh --seconds N        then fuzzes each target for N seconds from it
#   scripts/fuzz.sh --merge ...        afterwards, add the inputs that reached new edges to
#                                      fuzz/corpus/<target> (minimized; review before committing)
#   scripts/fuzz.sh ... TARGET...      only these targets (safetensors calibration manifest
#                                      block_file identity format_flags)
# New inputs go to build-fuzz/corpus/<target>, crashes to build-fuzz/artifacts/<target>/; a
# finding stops the run with libFuzzer's report and a nonzero status. Replay one input with
# build-fuzz/fuzz/fuzz_<target> FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=0
merge=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 1 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(safetensors calibration manifest block_file identity format_flags)

bash scripts/install-deps.sh clang libclang-rt-dev  # clang, libFuzzer and the sanitizer runtimes

dir=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNVFP4MLA_CUDA=OFF \
  -DNVFP4MLA_FUZZ=ON -DNVFP4MLA_BUILD_TESTS=OFF -DNVFP4MLA_BUILD_CLI=OFF -DNVFP4MLA_PLOTS=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Runs the current target; libFuzzer's status is the verdict, its report is shown on a finding.
run() {
  if ! "$bin" "${opts[@]}" "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz.sh: $t found a problem (input in $artifacts; replay: $bin FILE)" >&2
    exit 1
  fi
}
for t in "${targets[@]}"; do
  bin="$dir/fuzz/fuzz_$t"
  seeds="fuzz/corpus/$t"
  work="$dir/corpus/$t"
  artifacts="$PWD/$dir/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  opts=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$artifacts" -print_final_stats=0)
  [[ -f "fuzz/dict/$t.dict" ]] && opts+=(-dict="fuzz/dict/$t.dict")
  log="$dir/fuzz-$t.log"
  echo "== $t: replay $(find "$seeds" -type f | wc -l) corpus inputs$( ((seconds)) && echo ", then fuzz $seconds s")"
  run -runs=0 "$seeds"
  if ((seconds > 0)); then
    run -max_total_time="$seconds" "$work" "$seeds"
    grep -E "^#[0-9]+[[:space:]]+DONE" "$log" || true
  fi
  if ((merge)); then
    "$bin" "${opts[@]}" -merge=1 -use_counters=0 "$seeds" "$work" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
  fi
done
echo "fuzz.sh: no findings"
