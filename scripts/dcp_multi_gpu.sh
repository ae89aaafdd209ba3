#!/usr/bin/env bash
# Starts one `nvfp4mla dcp run` process per GPU (ranks 0..N-1 on devices 0..N-1) over NCCL and
# waits for them (docs/DCP.md, "Multi-GPU runs").
#
#   scripts/dcp_multi_gpu.sh N [--bin PATH] [--out DIR] [-- dcp run options...]
#
# Rank 0 hands the NCCL id to the others through DIR/nccl.id; every rank logs to DIR/rankR.log;
# rank 0 prints the table and writes DIR/dcp_run.json (every rank's phase times are gathered
# into it). When one rank fails, the others are stopped. NCCL_NVLS_ENABLE defaults to 0 (NVLink
# multicast off). NCCL: $NVFP4MLA_NCCL_LIBRARY, else libnccl.so.2 when the loader finds it, else
# the nvidia-nccl wheel that python3 knows of.
set -euo pipefail

usage() { echo "usage: $0 N [--bin PATH] [--out DIR] [-- dcp run options...]" >&2; exit 2; }
[[ $# -ge 1 && $1 =~ ^[1-9][0-9]*$ ]] || usage
world=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/nvfp4mla
out=dcp-run-$world-$(date -u +%Y%m%dT%H%M%S)
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ -x $bin ]] || { echo "$0: $bin is not an executable nvfp4mla (build it, or pass --bin)" >&2; exit 2; }
# (Without nvidia-smi the ranks report a missing device themselves.)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if command -v nvidia-smi >/dev/null && [[ $gpus -lt $world ]]; then
  echo "$0: $world ranks need $world GPUs; nvidia-smi lists $gpus" >&2
  exit 2
fi

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nccl=()
if [[ -n ${NVFP4MLA_NCCL_LIBRARY:-} ]]; then
  nccl=(--nccl-library "$NVFP4MLA_NCCL_LIBRARY")
elif ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  wheel=$(python3 -c "import os, nvidia.nccl; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null || true)
  [[ -n $wheel && -f $wheel ]] && nccl=(--nccl-library "$wheel")
fi

mkdir -p "$out"
id_file=$out/nccl.id
rm -f "$id_file"  # a stale id would make the ranks join a communicator that no longer exists
echo "DCP $world: logs and JSON in $out (NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE${nccl:+, ${nccl[1]}})"

pids=()
for ((r = 0; r < world; ++r)); do
  "$bin" dcp run --world "$world" --rank "$r" --device "$r" --id-file "$id_file" --json "$out/dcp_run.json" \
    "${nccl[@]}" "$@" >"$out/rank$r.log" 2>&1 &
  pids+=($!)
done

# Wait for every rank; after the first failure stop the others (they would wait in a collective).
status=0
live=("${pids[@]}")
while [[ ${#live[@]} -gt 0 ]]; do
  finished=
  set +e
  wait -n -p finished "${live[@]}"
  rc=$?
  set -e
  next=()
  for pid in "${live[@]}"; do [[ $pid == "$finished" ]] || next+=("$pid"); done
  live=("${next[@]}")
  if [[ $rc -ne 0 ]]; then
    status=$rc
    sleep 2  # let the others report what they saw
    for pid in "${live[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${live[@]}"; do wait "$pid" 2>/dev/null || true; done
    break
  fi
done

cat "$out/rank0.log"
for ((r = 1; r < world; ++r)); do
  if grep -q 'error' "$out/rank$r.log"; then
    echo "--- rank $r:"
    cat "$out/rank$r.log"
  fi
done
[[ $status -eq 0 ]] && echo "DCP $world: all ranks passed; $out/dcp_run.json" || echo "DCP $world: FAILED (exit $status)"
exit "$status"
