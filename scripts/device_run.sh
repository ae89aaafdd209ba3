#!/usr/bin/env bash
# One call on the GPU machine: tests, benchmarks, variant timings and a profile, logs under $OUT.
# Usage (from the repo root, with the binaries in .devbin/):
#   scripts/device_run.sh [tests|qualification|ab|bitcompare|bench|bars|bench-procs|bench-all|indexer|extend|eval|variants|ncu|stalls|locked|srcprof|sanitize]...
# Binaries packed by scripts/device_pack.sh: run its unpack.sh first, export the LD_LIBRARY_PATH
# it prints, and pass BIN=<pack>/bin/base or BIN=<pack>/bin/<variant>.
# The GPU image has no cairo: build the binaries for it with -DNVFP4MLA_PLOTS=OFF (eval --plot
# is then unavailable there), or the CLI will not load.
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-out}
mkdir -p "$OUT"
for step in "$@"; do
  case "$step" in
    tests)
      # Every GPU test but the verifier qualification, in ${SHARDS:-3} processes (one process takes
      # longer than a 10-minute device call: the CPU references dominate; 3 shards ~5.5 min on the
      # H200 machine, 2026-12-05). Shard logs name each test as it runs, so a timeout shows where.
      n=${SHARDS:-3}
      # The DCP tests run the CLI and scripts/ at the paths the test binary was built with; where
      # the binaries were built in another checkout, those paths are linked to this one.
      built=$(strings "$BIN/nvfp4mla_gpu_tests" | sed -n "s|^'\(/[^']*\)/scripts/dcp_multi_gpu.sh' 1 --bin '\([^']*\)'.*|\1 \2|p" | head -1)
      if [[ -n "$built" ]]; then
        read -r src cli <<<"$built"
        [[ -e "$src/scripts" ]] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }
        [[ -x "$cli" ]] || { mkdir -p "$(dirname "$cli")" && ln -sf "$(realpath "$BIN/nvfp4mla")" "$cli"; }
      fi
      for i in $(seq 0 $((n - 1))); do
        GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$BIN/nvfp4mla_gpu_tests" --gtest_filter='-Kernels/GpuVerifierQualification.*' \
          >"$OUT/gpu_tests_$i.log" 2>&1 &
      done
      wait
      for i in $(seq 0 $((n - 1))); do
        echo "gpu tests shard $i: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu_tests_$i.log" | tr '\n' ' ')"
        grep -E "^\[  FAILED" "$OUT/gpu_tests_$i.log" | head -10
      done ;;
    qualification)
      # The verifier qualification (docs/ROUTING.md) for the kernels in $KERNELS, one process each:
      # with two kernels side by side a test takes 70-140 s (16-core machine), so a call covers two
      # kernels; the CPU oracle and the random records set the pace.
      for k in ${KERNELS:-sm90_ws_wide sm90_h16}; do
        "$BIN/nvfp4mla_gpu_tests" --gtest_filter="Kernels/GpuVerifierQualification.*/$k" >"$OUT/qualification_$k.log" 2>&1 &
      done
      wait
      for k in ${KERNELS:-sm90_ws_wide sm90_h16}; do
        echo "qualification $k: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/qualification_$k.log" | tr '\n' ' ')"
        grep -E "^\[qualification\]|^\[  FAILED" "$OUT/qualification_$k.log" | head -10
      done ;;
    bench)
      "$BIN/nvfp4mla" bench decode --json "$OUT/decode.json" >"$OUT/decode.txt" 2>&1; tail -11 "$OUT/decode.txt"
      "$BIN/nvfp4mla" bench write --all-formats --json "$OUT/write.json" >"$OUT/write.txt" 2>&1; tail -8 "$OUT/write.txt" ;;
    bench-procs)
      # The issue's three decode shapes in ${PROCS:-3} separate processes (each keeps the GPU busy for
      # --warmup-seconds after its ceilings): the spread between processes is part of the measurement.
      for i in $(seq ${PROCS:-3}); do
        "$BIN/nvfp4mla" bench decode --rows 256 128 --heads 128 64 16 --topk 2048 --json "$OUT/decode_proc$i.json" >"$OUT/decode_proc$i.txt" 2>&1
        echo "process $i:"; grep -E "^nvfp4" "$OUT/decode_proc$i.txt" | awk '{printf "  %s x %s: %s us at %s MHz\n", $2, $3, $7, $14}'
      done ;;
    bars)
      # Issue 25's open bars with their own commands: decode 128 x 16 and 32 in three processes, the
      # staged extend 4096 x 64 and 128 at 65,536 slots in two and 128 alone in two more, each with
      # its JSON and the card's name.
      nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/bars_gpu.txt"
      for i in 1 2 3; do
        "$BIN/nvfp4mla" bench decode --topk 2048 --warmup-seconds 1 --rows 128 --heads 16 32 --json "$OUT/bars_decode$i.json" >"$OUT/bars_decode$i.txt" 2>&1
        echo "decode process $i:"; grep -E "^nvfp4" "$OUT/bars_decode$i.txt" | awk '{printf "  %s x %s: %s us at %s MHz\n", $2, $3, $7, $NF}'
      done
      # The staged extend at 64 and 128 heads, then 128 alone (after 64 heads in the same process it
      # starts on a hotter card, and the power cap moves its clock more than a change moves its time).
      for run in "64 128:bars_extend1" "64 128:bars_extend2" "128:bars_extend128_1" "128:bars_extend128_2"; do
        heads=${run%%:*} tag=${run#*:}
        "$BIN/nvfp4mla" bench extend --staged --rows 4096 --heads $heads --capacity 65536 --iters 10 --warmup-seconds 1 \
          --json "$OUT/$tag.json" >"$OUT/$tag.txt" 2>&1
        echo "staged extend, heads $heads ($tag):"; grep -E "^nvfp4" "$OUT/$tag.txt"
      done ;;
    bench-all)
      "$BIN/nvfp4mla" bench decode --all-formats --rows 256 128 --heads 128 64 32 16 --topk 2048 --iters 10 --json "$OUT/decode_all.json" >"$OUT/decode_all.txt" 2>&1; tail -58 "$OUT/decode_all.txt" ;;
    indexer)
      # Indexer logits: the GPU tests of every kernel choice (Wgmma, WgmmaWs, MmaSync) and of the
      # selection built on them, then the prefill and decode bars per kernel, 64 and 32 heads.
      "$BIN/nvfp4mla_gpu_tests" --gtest_filter='Mma/IndexLogitsGpu.*:FusedSelectGpu.*:DsaPipelineGpu*' >"$OUT/indexer_tests.log" 2>&1
      echo "indexer tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|error / A" "$OUT/indexer_tests.log" | head -40
      "$BIN/nvfp4mla" bench indexer --mma all --heads 64 32 --warmup-seconds 2 --json "$OUT/indexer.json" >"$OUT/indexer.txt" 2>&1
      tail -14 "$OUT/indexer.txt" ;;
    extend)
      "$BIN/nvfp4mla" bench extend --iters 10 --json "$OUT/extend.json" >"$OUT/extend.txt" 2>&1; tail -4 "$OUT/extend.txt" ;;
    eval)
      # The README's main command on the GPU (the default report), table + JSON.
      "$BIN/nvfp4mla" eval --device cuda --no-progress --json "$OUT/quality_h200.json" >"$OUT/quality_h200.txt" 2>&1
      echo "eval rc=$?"; grep -E "^  (bf16|fp8|nvfp4)|ran on|\(" "$OUT/quality_h200.txt" | tail -30 ;;
    ab)
      # Two builds alternating in one call, ${ROUNDS:-2} rounds: $A and $B are folders holding an
      # nvfp4mla CLI, $ARGS the bench arguments (default: the 16- and 32-head decode rows). Builds
      # are compared only within one call (docs/PERF.md, "Machine and method").
      for r in $(seq ${ROUNDS:-2}); do
        for b in "$A" "$B"; do
          name=$(basename "$b")
          "$b/nvfp4mla" bench ${ARGS:-decode --rows 128 --heads 16 32 --topk 2048 --warmup-seconds 1} \
            --json "$OUT/ab_${name}_$r.json" >"$OUT/ab_${name}_$r.txt" 2>&1
          echo "$name round $r:"
          grep -E '^(nvfp4|fp8|bf16)' "$OUT/ab_${name}_$r.txt" | awk '{printf "  %s x %s: %s us at %s MHz\n", $2, $3, $7, $14}'
        done
      done ;;
    bitcompare)
      # Whether two builds' decode kernels give the same bits: $A and $B are folders holding an
      # nvfp4mla CLI. Each case of $CASES ("rows heads cache-dtype rope scale-mode", ';'-separated,
      # '-' for the rope and scale mode of other formats) encodes random latents with $A's writer
      # (scripts/attend_inputs.py) and runs `attend --device cuda` with both builds on the same
      # cache, queries and indices (5% masked, ragged lengths).
      cases=${CASES:-"128 16 nvfp4_ds_mla fp8 dynamic;3 16 nvfp4_ds_mla fp8 dynamic;128 16 nvfp4_ds_mla bf16 implicit;5 8 nvfp4_ds_mla bf16 static;64 32 nvfp4_ds_mla fp8 dynamic"}
      IFS=';' read -ra case_list <<<"$cases"
      for c in "${case_list[@]}"; do
        read -r rows heads dtype rope mode <<<"$c"
        dir="$OUT/bitcompare/${rows}x${heads}_${dtype}_${rope}_${mode}"
        format=(--cache-dtype "$dtype")  # rope and scale mode: nvfp4_ds_mla only ('-' elsewhere)
        [[ "$rope" != - ]] && format+=(--rope "$rope")
        [[ "$mode" != - ]] && format+=(--scale-mode "$mode")
        [[ "$mode" == static ]] && format+=(--layer-scale 0.5)
        python3 scripts/attend_inputs.py "$dir" "$rows" "$heads" &&
          "$A/nvfp4mla" encode "${format[@]}" --input "$dir/latent.safetensors" --output "$dir/cache.safetensors" >"$dir/encode.txt" 2>&1 ||
          { echo "bitcompare $c: inputs failed"; continue; }
        result=
        for side in A B; do
          "${!side}/nvfp4mla" attend "${format[@]}" --cache "$dir/cache.safetensors" --query "$dir/q.safetensors" \
            --indices "$dir/indices.safetensors" --sm-scale 0.0417 --device cuda --output "$dir/out_$side.safetensors" \
            >"$dir/attend_$side.txt" 2>&1 || result+="attend of $side (${!side}) failed, see $dir/attend_$side.txt; "
        done
        if [[ -n "$result" ]]; then :  # a failed run is not reported as a difference
        elif cmp -s "$dir/out_A.safetensors" "$dir/out_B.safetensors"; then result=same
        else result=DIFFERENT; fi
        echo "bitcompare $c: $result"
        rm -f "$dir"/*.safetensors
      done ;;
    variants)
      # Time the decode with stages left out (results are garbage; only the time matters). Needs one
      # profiling build per value, configured with -DNVFP4MLA_DECODE_STAGE_SKIP=N, whose CLI is
      # $BIN/skipN/nvfp4mla (skip0: a normal build).
      for skip in 0 1 2 4 6; do
        "$BIN/skip$skip/nvfp4mla" bench decode --rows 256 128 --heads 128 16 --topk 2048 --iters 10 2>/dev/null |
          awk -v s=$skip '/nvfp4/ {printf "skip=%s rows=%s heads=%s median_us=%s\n", s, $2, $3, $7}'
      done | tee "$OUT/variants.txt" ;;
    ncu)
      ncu --clock-control none --kernel-name regex:sparse_decode_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section Occupancy \
        "$BIN/nvfp4mla" bench decode --rows 256 --heads 128 --topk 2048 --iters 1 --warmup 3 >"$OUT/ncu.txt" 2>&1
      grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|Registers|Shared Memory|Bank" "$OUT/ncu.txt" | head -40 ;;
    stalls)
      # Where warps wait: stall reasons per issued instruction, 16-head and 128-head shapes.
      m=smsp__average_warps_issue_stalled
      metrics=$(for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle \
                 not_selected selected dispatch_stall no_instruction imc_miss branch_resolving membar tex_throttle; do
                 printf "%s_%s_per_issue_active.ratio," $m $r; done)
      metrics="${metrics}sm__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
      for shape in ${STALL_SHAPES:-128x16 256x128}; do  # rows x heads
        set -- ${shape/x/ }
        ncu --clock-control none --kernel-name regex:sparse_decode --launch-skip 3 --launch-count 1 --metrics "$metrics" \
          "$BIN/nvfp4mla" bench decode --rows $1 --heads $2 --topk 2048 --iters 1 --warmup 3 >"$OUT/stalls_$1_$2.txt" 2>&1
        echo "== rows $1 heads $2"; grep -E "stalled|inst_executed|bank|warps_active|duration" "$OUT/stalls_$1_$2.txt" | awk '{print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//'
      done ;;
    locked)
      # Clock-locked A/B: kernel time and instruction count under ncu --clock-control base, for each binary in
      # $BINS (default: $BIN/nvfp4mla) and each shape in $SHAPES (RxH). Repeat launches agree within ~1%, where
      # plain bench runs of identical binaries spread 5-10% between calls.
      for bin in ${BINS:-$BIN/nvfp4mla}; do
        for shape in ${SHAPES:-128x16 256x128}; do
          set -- ${shape/x/ }
          ncu --clock-control base --kernel-name regex:"sparse_decode_(h16|ws|kernel)" --launch-skip 3 --launch-count 2 \
            --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
            "$bin" bench decode --rows $1 --heads $2 --topk 2048 --iters 3 --warmup 3 2>&1 |
            awk -v b="$bin" -v s="$shape" '/gpu__time_duration.sum|sm__inst_executed.sum|issue_active/ {print b, s, $1, $NF}'
        done
      done | tee "$OUT/locked.txt" ;;
    srcprof)
      # Source-level profile (SASS, stall reasons per instruction) of the decode kernel for one shape
      # ($SHAPE, RxH, default 256x128), summarized by role (setmaxnreg regions) by ncu_regions.py.
      set -- ${SHAPE:-256x128}; set -- ${1/x/ }
      ncu --clock-control none --kernel-name regex:"${KERNEL:-sparse_decode}" --launch-skip 3 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        "$BIN/nvfp4mla" bench decode --rows $1 --heads $2 --topk 2048 --iters 1 --warmup 3 >"$OUT/srcprof_$1_$2.csv" 2>&1
      python3 scripts/ncu_regions.py "$OUT/srcprof_$1_$2.csv" 16 ${OUTPUT_WG_REGS:-0xe0} | tee "$OUT/srcprof_$1_$2.txt" ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/nvfp4mla_gpu_tests" \
          --gtest_filter='GpuRecordCopy.*:*GpuSparseDecode.SanitizerSized/*:GpuSparseDecodeRowWalk.SanitizerSized:GpuSparseExtendStaged.SanitizerSized:*GpuSparseDecode.DegenerateOuterScales/*:GpuCacheWriter.BitIdenticalToCpuWriterBf16Input:GpuOffloadStaging.*:GpuSparseScores.TopkLengthInvalidIndicesAndRaggedTopk' \
          >"$OUT/sanitize_$tool.log" 2>&1
        echo "compute-sanitizer $tool rc=$?"; tail -3 "$OUT/sanitize_$tool.log"
      done ;;
  esac
done
