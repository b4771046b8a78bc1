/**
 * `gyre train`'s plain progress line (no terminal): until a device has joined it says so (with
 * `--devices 0`, `gyre train` passes how to add one), instead of an empty device list.
 */
import { describe, expect, it } from "vitest"
import { RunProgress } from "../../src/cli/progress.ts"

describe("run progress", () => {
  it("a run without devices says so, or what it was given to say", () => {
    const lines: Array<string> = []
    const write = (l: string) => lines.push(l)
    new RunProgress({ tty: false, write, plainEveryMs: 0 }, 8).setMicroBatches(undefined)
    new RunProgress({ tty: false, write, plainEveryMs: 0, noDevices: "start some" }, 8).setMicroBatches(undefined)
    expect(lines).toEqual([
      "progress: steps 0 done, executions 0 finished / 0 running, 0 tokens trained/s, score - | devices joining",
      "progress: steps 0 done, executions 0 finished / 0 running, 0 tokens trained/s, score - | start some"
    ])
  })
})
