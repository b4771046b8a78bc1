/**
 * The CPU SGEMM (native/src/cpu/gemm.c) on its own: `make -C native cpu-gemm-check` builds
 * native/tools/gemm_check.c with the engine's flags and runs 400 seeded random cases (every
 * transposition, shapes around the kernel's block edges, ragged leading dimensions, accumulate
 * or not, 1 to 3 threads) against a double-precision reference. The model tests reach the GEMM
 * only through the presets' shapes; this reaches its edges.
 */
import { describe, expect, it } from "vitest"
import { runMakeCheck } from "./helpers.ts"

describe("CPU GEMM", () => {
  it("matches a double-precision reference on 400 random shapes, transpositions and thread counts", () => {
    expect(runMakeCheck("cpu-gemm-check").trim().split("\n").at(-1)).toBe("400 cases, 0 off")
  }, 60_000)
})
