/**
 * Example: a new actor type in one file. An evaluator scores candidate answers against a
 * reference and keeps running statistics, snapshotted so a restart keeps them.
 *
 * Host it with `gyre node --load examples/evaluator.ts --spawn evaluator/e1`, then ask it:
 * `system.ask(refOf(EvaluatorProtocol, address("evaluator", "e1")), "Evaluate", { candidate, reference })`.
 */
import { Effect, Ref, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "../src/runtime/actor.ts"

export class EmptyReference extends Schema.TaggedError<EmptyReference>()("EmptyReference", {}) {}

const Stats = Schema.Struct({ evaluated: Schema.Number, scoreSum: Schema.Number })

export const EvaluatorProtocol = RpcGroup.make(
  Rpc.make("Evaluate", {
    payload: { candidate: Schema.String, reference: Schema.String },
    success: Schema.Struct({ score: Schema.Number, exact: Schema.Boolean }),
    error: EmptyReference
  }),
  Rpc.make("Stats", { success: Stats })
)

/** Token-overlap F1 between two whitespace-tokenised strings: 1 for an exact match, 0 for none. */
export const overlapF1 = (candidate: string, reference: string): number => {
  const c = candidate.split(/\s+/).filter((t) => t !== "")
  const r = reference.split(/\s+/).filter((t) => t !== "")
  const left = new Map<string, number>()
  for (const t of r) left.set(t, (left.get(t) ?? 0) + 1)
  let common = 0
  for (const t of c) {
    const n = left.get(t) ?? 0
    if (n > 0) {
      common++
      left.set(t, n - 1)
    }
  }
  return common === 0 ? 0 : (2 * common) / (c.length + r.length)
}

export const Evaluator = Actor.make({
  kind: "evaluator",
  protocol: EvaluatorProtocol,
  state: { schema: Stats, initial: () => ({ evaluated: 0, scoreSum: 0 }) },
  persistence: true,
  behaviour: (ctx) =>
    Effect.succeed({
      Evaluate: ({ candidate, reference }) =>
        reference.trim() === ""
          ? Effect.fail(new EmptyReference())
          : Effect.gen(function* () {
              const score = overlapF1(candidate, reference)
              yield* Ref.update(ctx.state, (s) => ({ evaluated: s.evaluated + 1, scoreSum: s.scoreSum + score }))
              return { score, exact: candidate.trim() === reference.trim() }
            }),
      Stats: () => Ref.get(ctx.state)
    })
})
