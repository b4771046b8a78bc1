/** Demonstration trees do not depend on how harnesses recorded side by side interleaved in the file. */
import { describe, expect, it } from "vitest"
import { demonstrationTrees, type Demonstration } from "../../src/training/warm-start.ts"

/** Task `task`'s calls: each one's history is the earlier replies, as a walking harness sends it. */
const taskCalls = (task: string, replies: ReadonlyArray<string>): Array<Demonstration> =>
  replies.map((reply, i) => ({
    task,
    id: `${task}-${i}`,
    role: "main",
    messages: [{ role: "system", content: "walk" }, ...replies.slice(0, i).flatMap((r) => [{ role: "user" as const, content: "next" }, { role: "assistant" as const, content: r }]), { role: "user", content: "next" }],
    reply
  }))

const sequences = (demos: ReadonlyArray<Demonstration>) =>
  demonstrationTrees(demos).map(({ execution, tree }) => ({ execution, calls: Array.from({ length: tree.callCount }, (_, c) => Array.from(tree.callSequence(c))) }))

describe("demonstration trees", () => {
  it("come in task order (numbers by value), each task's calls in file order, whatever the interleaving", () => {
    const a = taskCalls("train-10", ["get oak", "take gem"])
    const b = taskCalls("train-2", ["get elm", "report jade", "get ash"])
    const c = taskCalls("train-1", ["note x"])
    const one = sequences([a[0]!, b[0]!, a[1]!, c[0]!, b[1]!, b[2]!])
    const other = sequences([c[0]!, b[0]!, b[1]!, a[0]!, b[2]!, a[1]!])
    expect(one.map((t) => t.execution)).toEqual(["demo-train-1", "demo-train-2", "demo-train-10"])
    expect(other).toEqual(one)
    expect(one[1]!.calls).toHaveLength(3)
    // a later call's sequence extends the earlier one's: one path in the task's tree
    expect(one[1]!.calls[1]!.slice(0, one[1]!.calls[0]!.length - 1)).toEqual(one[1]!.calls[0]!.slice(0, -1))
  })
})
