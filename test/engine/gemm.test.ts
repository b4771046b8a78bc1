/**
 * The CPU SGEMM (native/src/cpu/gemm.c) on its own: `make -C native cpu-gemm-check` builds
 * native/tools/gemm_check.c with the engine's flags and runs 400 seeded random cases (every
 * transposition, shapes around the kernel's block edges, ragged leading dimensions, accumulate
 * or not, 1 to 3 threads) against a double-precision reference. The model tests reach the GEMM
 * only through the presets' shapes; this reaches its edges.
 */
import { execFileSync } from "node:child_process"
import { describe, expect, it } from "vitest"

const native = new URL("../../native", import.meta.url).pathname

describe("CPU GEMM", () => {
  it("matches a double-precision reference on 400 random shapes, transpositions and thread counts", () => {
    let out: string
    try {
      out = execFileSync("make", ["-C", native, "-s", "cpu-gemm-check"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })
    } catch (e) {
      const failed = e as { stdout?: string; stderr?: string }
      throw new Error(`cpu-gemm-check failed:\n${failed.stdout ?? ""}${failed.stderr ?? ""}`)
    }
    expect(out.trim().split("\n").at(-1)).toBe("400 cases, 0 off")
  }, 60_000)
})
