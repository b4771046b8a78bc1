/**
 * The audit's split of switches to rollout: those asked of a running step's core (it serves
 * again once its step's update is done, which the simulator models on its own) and the others.
 */
import { describe, expect, it } from "vitest"
import { coreLeavingSwitches, switchMessageId } from "../../src/scheduling/audit.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"

type Entry = Pick<PolicyRecord, "index" | "event" | "actions">
const at = 0
const record = (index: number, event: Entry["event"], actions: Entry["actions"] = []): Entry => ({ index, event, actions })
const toRollout = (cell: number) => ({ _tag: "SwitchRole", cell, role: "rollout" }) as const

describe("coreLeavingSwitches", () => {
  it("names the switches to rollout of a running step's core, and no other", () => {
    const records: Array<Entry> = [
      record(0, { _tag: "SwitchDone", cell: 0, role: "training", at }, [{ _tag: "StartStep", step: 0, core: 0, cells: [0] }]),
      // cell 1 is no core: its switch is a plain one
      record(1, { _tag: "MicroStepDone", step: 0, trained_tokens: 10, at }, [toRollout(1), toRollout(0)]),
      record(2, { _tag: "StepDone", step: 0, at }, [{ _tag: "PublishWeights", version: 1 }]),
      // after its step ended, cell 0 is no longer a core
      record(3, { _tag: "SwitchDone", cell: 0, role: "training", at }, [toRollout(0)]),
      record(4, { _tag: "SwitchDone", cell: 1, role: "training", at }, [{ _tag: "StartStep", step: 1, core: 1, cells: [1] }, toRollout(1)])
    ]
    expect([...coreLeavingSwitches(records)].sort()).toEqual([switchMessageId(1, 0), switchMessageId(4, 1)].sort())
  })
})
