/**
 * The toy suite's world, shared by its harness and its scorer (no Gyre imports: the suite is
 * a black box that only talks HTTP to OPENAI_BASE_URL).
 *
 * A task is a walk along a chain of numbered cells, generated from the task id. At each
 * decision the agent sees one short observation (the last message of its context) and must
 * answer with one short command:
 *
 *   "12: next 345"           -> "get 345"     follow the pointer
 *   "12: item 7 next 345"    -> "take 7"      pick up the item first...
 *   "took 7 next 345"        -> "get 345"     ...then follow the pointer
 *   "12: fork 88 next 345"   -> "spawn 88"    a subagent walks from cell 88 (forked context)
 *   "sub 41 next 345"        -> "get 345"     the subagent came back with 41
 *   "12: end 41"             -> "report 41"   the walk is over
 *   (user) "compact"         -> "note " + the observation before it (context compaction)
 *
 * The world does not react to mistakes: every reply is judged against its observation and
 * the walk moves on, so an execution always makes the configured number of decisions and
 * its score is the fraction judged right.
 */

/** The configuration of a walk and its harness, from the environment (ARCHITECTURE.md lists the knobs). */
export const configFrom = (env) => {
  const num = (name, fallback, min) => {
    const text = env[name]
    if (text === undefined || text === "") return fallback
    const v = Number(text)
    if (!Number.isFinite(v) || v < min) throw new Error(`${name}=${text}: expected a number >= ${min}`)
    return v
  }
  const policy = env.TOY_POLICY || "model"
  if (policy !== "model" && policy !== "oracle") throw new Error(`TOY_POLICY=${policy}: expected model or oracle`)
  return {
    steps: Math.floor(num("TOY_STEPS", 64, 2)),
    forkEvery: Math.floor(num("TOY_FORK_EVERY", 16, 0)),
    subSteps: Math.floor(num("TOY_SUB_STEPS", 4, 1)),
    itemRate: num("TOY_ITEM_RATE", 0.25, 0),
    compactBytes: Math.floor(num("TOY_COMPACT_BYTES", 1024, 0)),
    failRate: num("TOY_FAIL_RATE", 0.05, 0),
    maxRetries: Math.floor(num("TOY_MAX_RETRIES", 2, 0)),
    toolMs: num("TOY_TOOL_MS", 20, 0),
    toolSigma: num("TOY_TOOL_SIGMA", 1, 0),
    tailAlpha: num("TOY_TAIL_ALPHA", 1.5, 0),
    temperature: num("TOY_TEMPERATURE", 1, 0),
    maxTokens: Math.floor(num("TOY_MAX_TOKENS", 48, 1)),
    model: env.TOY_MODEL || "gyre",
    policy,
    demos: env.TOY_DEMOS || undefined,
    randomSeed: env.TOY_RANDOM_SEED === undefined || env.TOY_RANDOM_SEED === "" ? undefined : num("TOY_RANDOM_SEED", 0, 0)
  }
}

export const systemPrompt =
  "You walk a chain of cells. Answer the last message with one command: get N, take N, spawn N, report N, or note TEXT."

/** The user message that asks for a context compaction. */
export const compactRequest = "compact"

/** mulberry32: a small deterministic generator in [0, 1). */
export const generator = (seed) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** FNV-1a of a string: the task id's seed (train and held-out ids differ, so do their walks). */
export const seedOf = (text) => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0
  return h
}

/**
 * One walk of `n` decisions from `cell`: a list of `{ text, reply, sub? }` (observation,
 * expected reply, and for a fork the subagent's walk). Forks only where `forkAt(j)` says.
 */
const walk = (rand, cfg, n, cell, forkAt) => {
  const key = () => Math.floor(rand() * 1000)
  const value = () => Math.floor(rand() * 100)
  const out = []
  let pending = undefined
  for (let j = 0; j < n; j++) {
    const next = key()
    if (j === n - 1) {
      const v = value()
      out.push({ text: `${cell}: end ${v}`, reply: `report ${v}` })
    } else if (pending !== undefined) {
      out.push({ text: `${pending} next ${cell}`, reply: `get ${cell}` })
      pending = undefined
    } else if (j < n - 2 && forkAt(j)) {
      const start = key()
      const sub = walk(rand, cfg, cfg.subSteps, start, () => false)
      const result = sub[sub.length - 1].reply.slice("report ".length)
      out.push({ text: `${cell}: fork ${start} next ${next}`, reply: `spawn ${start}`, sub })
      pending = `sub ${result}`
      cell = next
    } else if (j < n - 2 && rand() < cfg.itemRate) {
      const v = value()
      out.push({ text: `${cell}: item ${v} next ${next}`, reply: `take ${v}` })
      pending = `took ${v}`
      cell = next
    } else {
      out.push({ text: `${cell}: next ${next}`, reply: `get ${next}` })
      cell = next
    }
  }
  return out
}

/** The main walk of a task: `cfg.steps` decisions, a fork at every `cfg.forkEvery`-th one. */
export const scriptOf = (taskId, cfg) => {
  const rand = generator(seedOf(taskId))
  let nextFork = cfg.forkEvery
  const forkAt = (j) => {
    if (cfg.forkEvery <= 0 || j + 1 < nextFork) return false
    nextFork = j + 1 + cfg.forkEvery
    return true
  }
  return walk(rand, cfg, cfg.steps, Math.floor(rand() * 1000), forkAt)
}

/** Decision ids: `m<j>` (main), `s<k>.<j>` (k-th subagent), `n<j>` (compaction before main decision j). */
export const expectedReplies = (script) => {
  const expected = new Map()
  let k = 0
  script.forEach((step, j) => {
    expected.set(`m${j}`, step.reply)
    if (step.sub) {
      step.sub.forEach((s, i) => expected.set(`s${k}.${i}`, s.reply))
      k++
    }
  })
  return expected
}

/** A well-formed reply: one command on one line. */
export const wellFormed = (reply) => /^(get|take|spawn|report) \d{1,4}$/.test(reply) || /^note [^\n]{1,200}$/.test(reply)

/** The scripted oracle: the right reply to a context, from its last message(s) alone. */
export const oracleReply = (messages) => {
  const last = messages[messages.length - 1]
  if (last.role === "user" && last.content === compactRequest) return `note ${messages[messages.length - 2].content}`
  const rules = [
    [/item (\d+)/, "take"],
    [/fork (\d+)/, "spawn"],
    [/end (\d+)/, "report"],
    [/next (\d+)/, "get"]
  ]
  for (const [pattern, verb] of rules) {
    const m = pattern.exec(last.content)
    if (m) return `${verb} ${m[1]}`
  }
  return "get 0"
}

/**
 * Tool latency sampler: per call lognormal (median `toolMs`, shape `toolSigma`) times a
 * per-execution Pareto(1, `tailAlpha`) slowness factor (capped at 100), so most executions
 * are quick and a few are many times slower.
 */
export const latencySampler = (rand, cfg) => {
  const gauss = () => Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand())
  const slowness = cfg.tailAlpha > 0 ? Math.min(100, Math.pow(1 - rand(), -1 / cfg.tailAlpha)) : 1
  return { slowness, next: () => (cfg.toolMs <= 0 ? 0 : cfg.toolMs * slowness * Math.exp(cfg.toolSigma * gauss())) }
}
