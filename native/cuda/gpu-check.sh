#!/usr/bin/env bash
# native/cuda/gpu-check.sh - the CUDA backend's checks on a machine with an NVIDIA GPU of
# compute capability 9.0 (H100 / H200); called by native/gpu-check.sh, runnable alone from
# the repository root. At most 8 minutes (the steps' time limits add up to 480 s; a run
# on an H200 should take about 3).
#
#   1. build the CPU and CUDA libraries and the CUDA tools (make -j)
#   2. gyre-cuda-gemm-check   every GEMM path against a double-precision reference
#   3. gyre-cuda-check compare  CUDA against CPU through the ABI: built-in models plus the
#      tiny, small and tiny-long presets (logits, decode, fork, hand-off both ways, SFT/PPO
#      gradients on a forest batch (the attention's ancestor ranges), the same batch trained
#      in chunks (K/V of earlier chunks kept, dK/dV carried back) against the CPU unchunked,
#      determinism, AdamW, optimizer state, error paths)
#   4. gyre-cuda-check long   tiny-long: a 2048-token path at positions from 120,000, CUDA
#      unchunked and chunked against the CPU; attention pairs per second of training a
#      4096-token path and a 131072-token one (chunks of 4096) -> long.json
#   5. gyre-cuda-probe        the card's measured memory bandwidth and F32 SGEMM rate
#   6. gyre-cuda-check bench  tiny and small: prefill, decode at contexts 512 and 4096
#      (fraction of measured bandwidth), training (fraction of the measured SGEMM rate)
#
# Figures go to $OUT when set (compare.json, long.json, probe.json, bench-<preset>.json,
# figures.txt with the attention rates, and cuda-check.log with everything printed), else to
# a temporary directory that is printed. Exit status: 0 when every check passed, 1 when a
# check failed, 2 when the machine cannot run them.
set -euo pipefail

cd "$(dirname "$0")/../.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
log="$out/cuda-check.log"
: >"$log"
say() { echo "== $*" | tee -a "$log"; }
# step NAME SECONDS COMMAND...: runs COMMAND under a time limit, output to the log and the screen
step() {
  local name="$1" limit="$2"
  shift 2
  say "$name (limit ${limit}s)"
  local rc=0
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log" || rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then say "$name: timed out after ${limit}s"; fi
  return "$rc"
}

command -v nvcc >/dev/null || { say "nvcc not found: install the CUDA toolkit (12.x or 13.x)"; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log" || true

jobs=$(nproc 2>/dev/null || echo 4)
step "build" 120 make -C native -j"$jobs" all cuda cuda-tools || { say "build failed"; exit 2; }

failed=0 rc=0
step "gemm paths" 20 native/build/gyre-cuda-gemm-check || rc=$?
if [ "$rc" -eq 2 ]; then say "no usable CUDA device here (see above)"; exit 2; fi
[ "$rc" -eq 0 ] || failed=1

# The presets as checkpoint directories: `gyre engine init` when the CLI can run here, else
# config.json alone (random weights) read from src/engine/presets.ts.
ckpt="$out/checkpoints"
mkdir -p "$ckpt"
preset_config() { # preset_config NAME: config.json of a preset, from the TypeScript source
  local vocab
  vocab=$(sed -n 's/^export const VOCAB_SIZE = \([0-9]*\).*/\1/p' src/engine/tokenizer.ts)
  awk -v name="$1" -v vocab="$vocab" '
    { head = $1; gsub("\"", "", head) }
    head == name ":" && $2 == "{" { inside = 1; printf "{"; sep = ""; next }
    inside && $1 ~ /^}/ { print "}"; exit }
    inside { key = head; sub(":", "", key); value = $2; sub(",", "", value)
             if (value ~ /^[0-9_]+$/) gsub("_", "", value)
             if (value == "VOCAB_SIZE") value = vocab
             printf "%s\"%s\": %s", sep, key, value; sep = ", " }' src/engine/presets.ts
}
for preset in tiny small tiny-long; do
  dir="$ckpt/$preset"
  if ! { command -v node >/dev/null && timeout 60 node bin/gyre.js engine init --preset "$preset" --seed 1 --out "$dir" \
           >>"$log" 2>&1; }; then
    mkdir -p "$dir"
    preset_config "$preset" >"$dir/config.json"
    say "$preset: no engine CLI here, config.json from src/engine/presets.ts, random weights: $(cat "$dir/config.json")"
  fi
done

step "compare cuda with cpu" 120 native/build/gyre-cuda-check compare --cpu native/build/libgyre_cpu.so \
  --cuda native/build/libgyre_cuda.so --checkpoint "$ckpt/tiny" --checkpoint "$ckpt/small" \
  --checkpoint "$ckpt/tiny-long" --json "$out/compare.json" || failed=1

step "long paths" 90 native/build/gyre-cuda-check long --cpu native/build/libgyre_cpu.so \
  --cuda native/build/libgyre_cuda.so --checkpoint "$ckpt/tiny-long" --long 131072 --json "$out/long.json" || failed=1
if [ -s "$out/long.json" ]; then
  { echo "attention pairs/s, CUDA training of one tiny-long path (chunks of 4096): $(tr -d '{}' <"$out/long.json")"; } \
    | tee "$out/figures.txt" | tee -a "$log"
fi

step "probe" 30 native/build/gyre-cuda-probe --json "$out/probe.json" || { say "probe failed"; failed=1; }
probe_flag=()
[ -s "$out/probe.json" ] && probe_flag=(--probe "$out/probe.json")
for preset in tiny small; do
  step "bench $preset" 50 native/build/gyre-cuda-check bench --cuda native/build/libgyre_cuda.so \
    --checkpoint "$ckpt/$preset" "${probe_flag[@]}" --json "$out/bench-$preset.json" || failed=1
done

say "figures in $out"
exit "$failed"
