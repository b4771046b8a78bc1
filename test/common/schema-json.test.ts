/**
 * `jsonWriter` writes exactly the text the schema's own JSON codec gives, for every policy state
 * of simulated runs (as built, and rebuilt in another key order with a stray key), for random
 * values of a schema with optional fields, tagged and literal unions and null, and for random
 * action lists; it refuses what it cannot write (a transformation, a class, a recursive
 * schema) and returns undefined for a value that does not fit, where the codec decides.
 */
import { createHash } from "node:crypto"
import fc from "fast-check"
import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { jsonWriter } from "../../src/common/schema-json.ts"
import { asyncSplit, colocate, elastic, elasticPublished } from "../../src/policy/index.ts"
import type { Policy } from "../../src/policy/policy.ts"
import { PolicyAction } from "../../src/policy/vocabulary.ts"
import { actionsJson, stateDigest } from "../../src/scheduling/driver.ts"
import { executionsOf, policyConfigOf } from "../../src/sim/scenario.ts"
import { simulate } from "../../src/sim/simulate.ts"
import { recordedScenario } from "../policy/fixtures.ts"

const viaCodec = (schema: Schema.Codec<unknown, unknown>) => {
  const encode = Schema.encodeSync(Schema.toCodecJson(schema))
  return (value: unknown) => JSON.stringify(encode(value))
}

/** The same value with every object's keys in reverse order and a key no schema names. */
const shuffled = (v: unknown): unknown =>
  Array.isArray(v)
    ? v.map(shuffled)
    : typeof v === "object" && v !== null
      ? Object.fromEntries([["zzStray", 1], ...Object.entries(v).reverse().map(([k, x]) => [k, shuffled(x)])])
      : v

const scenario = recordedScenario

describe("jsonWriter", () => {
  for (const policy of [colocate, asyncSplit(2), elastic, elasticPublished] as ReadonlyArray<Policy<unknown>>) {
    it(`${policy.name}: every state of a simulated run, as the codec writes it`, () => {
      const write = jsonWriter(policy.State)
      expect(write).toBeDefined()
      const codec = viaCodec(policy.State)
      let state = policy.initial(policyConfigOf(scenario))
      const journal = simulate(scenario, executionsOf(scenario), policy, { journal: true }).journal!
      expect(journal.length).toBeGreaterThan(100)
      for (const { event } of journal) {
        state = policy.step(state, event).state
        const expected = codec(state)
        expect(write!(state)).toBe(expected)
        expect(write!(shuffled(state))).toBe(expected)
        expect(stateDigest(policy, state)).toBe(createHash("sha256").update(expected).digest("hex"))
      }
    })
  }

  const Shape = Schema.Struct({
    name: Schema.String,
    count: Schema.Int,
    ratio: Schema.optional(Schema.Number),
    flags: Schema.Array(Schema.Boolean),
    kind: Schema.Literals(["a", "b", 3]),
    nothing: Schema.Null,
    item: Schema.Union([Schema.TaggedStruct("P", { x: Schema.Number }), Schema.TaggedStruct("Q", { y: Schema.String, z: Schema.optional(Schema.Int) })])
  }) as Schema.Codec<unknown, unknown>
  const shapes = fc.record(
    {
      name: fc.string({ unit: "grapheme" }),
      count: fc.integer(),
      ratio: fc.double({ noNaN: true, noDefaultInfinity: true }),
      flags: fc.array(fc.boolean()),
      kind: fc.constantFrom("a", "b", 3),
      nothing: fc.constant(null),
      item: fc.oneof(
        fc.record({ _tag: fc.constant("P"), x: fc.double({ noNaN: true, noDefaultInfinity: true }) }),
        fc.record({ _tag: fc.constant("Q"), y: fc.string(), z: fc.integer() }, { requiredKeys: ["_tag", "y"] })
      )
    },
    { requiredKeys: ["name", "count", "flags", "kind", "nothing", "item"] }
  )

  it("optional fields, literal and tagged unions, null: as the codec writes them", () => {
    const write = jsonWriter(Shape)!
    const codec = viaCodec(Shape)
    fc.assert(fc.property(shapes, (v) => write(v) === codec(v) && write(shuffled(v)) === codec(v)), { numRuns: 500 })
  })

  it("action lists, as the codec writes them", () => {
    const codec = viaCodec(Schema.Array(PolicyAction) as Schema.Codec<unknown, unknown>)
    const count = fc.nat({ max: 1000 })
    const action = fc.oneof(
      fc.record({ _tag: fc.constant("Dispatch"), batch: count }),
      fc.record({ _tag: fc.constant("SwitchRole"), cell: count, role: fc.constantFrom("rollout", "training") }),
      fc.record({ _tag: fc.constant("StartStep"), step: count, core: count, cells: fc.array(count) }),
      fc.record({ _tag: fc.constant("JoinStep"), step: count, cell: count }),
      fc.record({ _tag: fc.constant("PublishWeights"), version: count })
    )
    fc.assert(fc.property(fc.array(action, { maxLength: 6 }), (actions) => actionsJson(actions as Array<PolicyAction>) === codec(actions)), { numRuns: 300 })
  })

  it("values that do not fit give undefined; schemas it cannot write give no writer", () => {
    const write = jsonWriter(Shape)!
    const base = { name: "n", count: 1, flags: [], kind: "a", nothing: null, item: { _tag: "P", x: 1 } }
    expect(write(base)).toBe(viaCodec(Shape)(base))
    for (const bad of [{ ...base, ratio: Infinity }, { ...base, count: "1" }, { ...base, kind: "c" }, { ...base, item: { _tag: "R" } }, { ...base, flags: [1] }, { name: "n" }, null, []]) {
      expect(write(bad)).toBeUndefined()
    }
    expect(jsonWriter(Schema.NumberFromString)).toBeUndefined()
    expect(jsonWriter(Schema.Struct({ at: Schema.Date }))).toBeUndefined()
    expect(jsonWriter(Schema.Record(Schema.String, Schema.Number))).toBeUndefined()
    expect(jsonWriter(Schema.Union([Schema.String, Schema.Number]))).toBeUndefined()
  })
})
