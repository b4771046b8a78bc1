/**
 * A recorded run fed back through its policy yields the same actions: the journal of every
 * event (encoded to JSON with the Schema, as the live scheduler journals it) is decoded and
 * replayed from the initial state, and from a JSON snapshot of the state taken mid-run.
 */
import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { asyncSplit, colocate, elastic, elasticPublished, replay } from "../../src/policy/index.ts"
import type { Policy } from "../../src/policy/policy.ts"
import { PolicyEvent } from "../../src/policy/vocabulary.ts"
import { executionsOf, policyConfigOf } from "../../src/sim/scenario.ts"
import { simulate } from "../../src/sim/simulate.ts"
import { recordedScenario } from "./fixtures.ts"

const scenario = recordedScenario
const config = policyConfigOf(scenario)
const encodeEvent = Schema.encodeSync(PolicyEvent)
const decodeEvent = Schema.decodeUnknownSync(PolicyEvent)

const policies: ReadonlyArray<Policy<any>> = [colocate, asyncSplit(2), elastic, elasticPublished]

describe("replay", () => {
  for (const policy of policies) {
    it(`${policy.name}: the journal replays to the same actions`, () => {
      const run = simulate(scenario, executionsOf(scenario), policy, { journal: true })
      const journal = run.journal!
      expect(journal.some((j) => j.actions.length > 0)).toBe(true)
      const lines = journal.map((j) => JSON.stringify(encodeEvent(j.event)))
      const events = lines.map((line) => decodeEvent(JSON.parse(line)))
      expect(replay(policy, config, events)).toEqual(journal.map((j) => j.actions))
    })

    it(`${policy.name}: a JSON snapshot of the state resumes the run`, () => {
      const journal = simulate(scenario, executionsOf(scenario), policy, { journal: true }).journal!
      const half = Math.floor(journal.length / 2)
      let state = policy.initial(config)
      for (const { event } of journal.slice(0, half)) state = policy.step(state, event).state
      const snapshot = JSON.stringify(Schema.encodeSync(policy.State)(state))
      let resumed = Schema.decodeUnknownSync(policy.State)(JSON.parse(snapshot))
      for (const { event, actions } of journal.slice(half)) {
        const t = policy.step(resumed, event)
        expect(t.actions).toEqual(actions)
        resumed = t.state
      }
    })
  }
})
