import { Effect } from "effect"
import { withRunLog } from "../src/cli/replay.ts"
import { readRunConfig } from "../src/scheduling/records.ts"
import { auditRun } from "../src/scheduling/audit.ts"
import { runScenario } from "../src/replay/what-if.ts"
import { executionsOf } from "../src/sim/scenario.ts"
import { simulate } from "../src/sim/simulate.ts"
import { fixedPolicies } from "../src/policy/index.ts"
const run = process.argv[2]!
await Effect.runPromise(withRunLog(run, `.gyre/runs/${run}`, (log) => Effect.gen(function* () {
  const config = (yield* readRunConfig(log))!
  const audit = yield* auditRun(log, config.policyConfig.executions_per_step)
  const sc = runScenario(audit, config, audit.cells.length)
  console.log(JSON.stringify({ rate: sc.train_tokens_per_s_per_cell, sw_t: sc.switch_to_train_s, sw_r: sc.switch_to_rollout_s, sync: sc.weight_sync_s }))
  const r = simulate(sc, executionsOf(sc), fixedPolicies[config.policy]!, { journal: true })
  for (const j of r.journal!) {
    const e = j.event as any
    if (["StepDone", "StepStarted", "ExecutionFinished", "WeightsPublished", "SwitchDone"].includes(e._tag)) console.log("SIM", e._tag, e.at?.toFixed?.(2), e.step ?? e.execution ?? e.version ?? "", j.actions.map((a: any) => a._tag).join(","))
  }
  return 0
})) as any)
