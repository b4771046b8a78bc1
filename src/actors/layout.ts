/**
 * The RL parts' NATS layout of a run `R`, beside the runtime's (`src/runtime/names.ts`):
 *
 * | name | kind | contents |
 * | --- | --- | --- |
 * | `GYRE_R_TRAJECTORIES` | stream, limits retention | `gyre.R.calls.<execution>`: one delta-encoded `CallRecord` per model call (JSON, `src/tree/record.ts`); `gyre.R.outcomes.<execution>`: the `ExecutionOutcome` (JSON, `src/tree/outcome.ts`) |
 * | `GYRE_R_weights` | object store | one object per policy version, `v<version>`: a `model.safetensors` (F32, Hugging Face names) |
 * | `gyre.R.tokens.<request>` | core NATS subject | streamed chunks of one generation (`TokenChunk`), for `stream: true` |
 *
 * Execution ids are subject tokens: letters, digits, `_` and `-`.
 */
import { Schema } from "effect"
import { checkRun } from "../runtime/names.ts"

const EXECUTION = /^[A-Za-z0-9_-]+$/

export const ExecutionId = Schema.String.check(Schema.isPattern(EXECUTION))

export const rlLayout = (run: string) => {
  checkRun(run)
  const base = `gyre.${run}`
  return {
    trajectoryStream: `GYRE_${run}_TRAJECTORIES`,
    trajectorySubjects: [`${base}.calls.>`, `${base}.outcomes.>`],
    calls: (execution: string) => `${base}.calls.${execution}`,
    allCalls: `${base}.calls.>`,
    outcomes: (execution: string) => `${base}.outcomes.${execution}`,
    allOutcomes: `${base}.outcomes.>`,
    weightsBucket: `GYRE_${run}_weights`,
    weightsObject: (version: number) => `v${version}`,
    tokens: (request: string) => `${base}.tokens.${request}`
  }
}

export type RlLayout = ReturnType<typeof rlLayout>
