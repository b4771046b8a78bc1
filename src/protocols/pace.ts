/**
 * A device's pace: the fixed rates a paced device completes its work at (`--pace
 * decode=T1,prefill=T2,train=T3`, any subset), shared by the run's configuration, the CLI and
 * the devices (`src/serving/pace.ts` applies it).
 *
 * - `decode`: decode steps per second. A decode step gives every running sequence one token,
 *   and takes 1/T s whatever the batch, as on an accelerator, where a decode step reads the
 *   weights once for the whole batch: each sequence decodes at T tokens/s. The batch stays
 *   bounded by the device's KV pool and `maxBatch`.
 * - `prefill`: prompt tokens per second of the device (a chunk of n tokens takes n/T s).
 * - `train`: trained tokens per second of the device (a micro-batch of n tokens takes n/T s).
 *
 * Text form: `kind=rate` pairs joined by commas, each rate a positive number; the parser's
 * error is one line naming what is wrong.
 */
import { Schema } from "effect"

const Rate = Schema.Finite.check(Schema.isGreaterThan(0))

export const PaceKind = Schema.Literals(["decode", "prefill", "train"])
export type PaceKind = typeof PaceKind.Type
export const paceKinds: ReadonlyArray<PaceKind> = ["decode", "prefill", "train"]

export const Pace = Schema.Struct({
  decode: Schema.optional(Rate),
  prefill: Schema.optional(Rate),
  train: Schema.optional(Rate)
})
export type Pace = typeof Pace.Type

/** `text` as a Pace (undefined for an empty text: not paced), or the one-line reason it is not one. */
export const parsePace = (text: string): Pace | undefined | { readonly error: string } => {
  if (text.trim() === "") return undefined
  const pace: { -readonly [K in PaceKind]?: number } = {}
  for (const part of text.split(",")) {
    const m = /^\s*([a-z]+)\s*=\s*(\S+)\s*$/.exec(part)
    if (m === null) return { error: `'${part}' is not kind=rate (kinds: ${paceKinds.join(", ")})` }
    const kind = paceKinds.find((k) => k === m[1])
    if (kind === undefined) return { error: `unknown kind '${m[1]}' (kinds: ${paceKinds.join(", ")})` }
    if (pace[kind] !== undefined) return { error: `${kind} given twice` }
    const rate = Number(m[2])
    if (!Number.isFinite(rate) || rate <= 0) return { error: `${kind}=${m[2]}: the rate must be a number > 0 (per second)` }
    pace[kind] = rate
  }
  return pace
}

/** The text form (`decode=40,prefill=2000,train=1500`), the kinds in a fixed order; "" when not paced. */
export const formatPace = (pace: Pace | undefined): string =>
  pace === undefined ? "" : paceKinds.flatMap((k) => (pace[k] === undefined ? [] : [`${k}=${pace[k]}`])).join(",")
