#!/usr/bin/env bash
# native/gpu-check.sh - the engine's checks on a machine with an NVIDIA GPU of compute
# capability 9.0 (H100 / H200), run from anywhere; under 10 minutes (the steps' limits add
# up to 480 + 50 + 50 s). Self-contained: needs nvcc, make and a C compiler; Node.js only for
# step 2.
#
#   1. native/cuda/gpu-check.sh: builds the CPU and CUDA libraries (make, -arch=sm_90, static
#      cudart) and the CUDA tools; checks every GEMM path; compares the CUDA backend with the
#      CPU backend through the C ABI on built-in models and the tiny, small and tiny-long
#      presets (logits, decode, fork, KV hand-off both ways, SFT and PPO gradients on a forest
#      batch through the ancestor ranges, the same batch trained in chunks, determinism,
#      AdamW, optimizer state, error paths); tiny-long at positions past 120,000, chunked and
#      unchunked, against the CPU; attention pairs per second of training a 4096-token path and
#      a 131072-token one ($OUT/figures.txt, $OUT/long.json); measures the card's memory
#      bandwidth and F32 SGEMM rate; times prefill, decode at contexts 512 and 4096 (as a
#      fraction of the bandwidth) and training (as a fraction of the SGEMM rate).
#   2. Where Node.js and node_modules are present: the engine's TypeScript tests with
#      GYRE_BACKEND=cuda (the same correctness tests as on the CPU), then the benchmark
#      (bench/engine.ts) on the CUDA backend.
#
# Figures and logs go to $OUT when set (else a temporary directory, printed). Exit status:
# 0 when every check passed, 1 when one failed, 2 when the machine cannot run them.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
echo "gpu-check: figures and logs in $OUT"

bash native/cuda/gpu-check.sh
status=$?
[ "$status" -eq 2 ] && exit 2

if command -v node >/dev/null && [ -d node_modules/vitest ] && [ -f native/build/libgyre_cuda.so ]; then
  echo "== engine tests on the CUDA backend (limit 50s)"
  GYRE_BACKEND=cuda timeout --kill-after=5 50 npx vitest run test/engine >"$OUT/engine-tests-cuda.log" 2>&1
  rc=$?
  tail -n 15 "$OUT/engine-tests-cuda.log"
  [ "$rc" -eq 0 ] || status=1
  echo "== engine bench on the CUDA backend (limit 50s)"
  GYRE_BACKEND=cuda timeout --kill-after=5 50 node --import tsx bench/engine.ts --quick >"$OUT/engine-bench-cuda.log" 2>&1 ||
    echo "gpu-check: bench/engine.ts did not finish (see $OUT/engine-bench-cuda.log)"
  tail -n 12 "$OUT/engine-bench-cuda.log"
else
  echo "gpu-check: no Node.js with node_modules here: the TypeScript tests and bench/engine.ts are skipped;"
  echo "           step 1 covered the same comparisons through the C ABI"
fi
echo "gpu-check: $([ "$status" -eq 0 ] && echo "all checks passed" || echo "a check FAILED") (logs in $OUT)"
exit "$status"
