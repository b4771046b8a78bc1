/**
 * The toy suite's world, shared by its harness and its scorer (no Gyre imports: the suite is
 * a black box that only talks HTTP to OPENAI_BASE_URL).
 *
 * A task is a walk through named places, generated from the task id. At each decision the
 * agent sees one short observation (the last message of its context) and answers with one
 * short command, a verb and a word: the verb follows from the observation's keyword, the word
 * is the one word of the verb's kind in the observation (a place for get and spawn, an item
 * for take and report). Places and items come from two small vocabularies, so the word to
 * write is found by what it is, not by where it is.
 *
 *   "next oak"              -> "get oak"       follow the path
 *   "next oak, item gem"    -> "take gem"      pick up the item first...
 *   "took gem, next oak"    -> "get oak"       ...then follow the path
 *   "fork elm"              -> "spawn elm"     a subagent walks from elm (forked context)
 *   "sub jade, next oak"    -> "get oak"       the subagent came back with jade
 *   "end jade"              -> "report jade"   the walk is over
 *   (user) "compact"        -> "note " + the next command (context compaction); the walk
 *                              resumes from [system, that command]: "take gem" -> "take gem"
 *
 * The world does not react to mistakes: every reply is judged against its observation and
 * the walk moves on, so an execution always makes the configured number of decisions; its
 * score is the mean credit of its decisions (the fraction of words in place).
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
    randomSeed:
      env.TOY_RANDOM_SEED !== undefined && env.TOY_RANDOM_SEED !== ""
        ? num("TOY_RANDOM_SEED", 0, 0)
        : env.GYRE_SEED && env.GYRE_EXECUTION_ID
          ? executionSeed(env.GYRE_SEED, env.GYRE_EXECUTION_ID)
          : undefined
  }
}

/**
 * The seed of one execution's draws (tool latency, failures) from the run's seed and the
 * execution's id (FNV-1a of `seed/id`): the same run seed draws the same again, execution by
 * execution, whatever the policy or the order executions run in.
 */
export const executionSeed = (seed, execution) => {
  let h = 0x811c9dc5
  for (const ch of `${seed}/${execution}`) h = Math.imul(h ^ ch.charCodeAt(0), 0x01000193) >>> 0
  return h
}

export const systemPrompt = "Walk the places. Answer the last message with one command: get PLACE, take ITEM, spawn PLACE, report ITEM; asked to compact, note the next command."

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

export const places = ["ash", "bay", "cave", "dune", "elm", "fen", "glen", "hill", "isle", "jetty", "keep", "lake", "moor", "nook", "oak", "pier"]
export const items = ["amber", "bell", "coin", "drum", "egg", "flute", "gem", "horn", "ink", "jade", "key", "lamp", "map", "nut", "opal", "pearl"]

const pick = (rand, words) => words[Math.floor(rand() * words.length)]

/**
 * One walk of `n` decisions: a list of `{ text, reply, sub? }` (observation, expected reply,
 * and for a fork the subagent's walk). Forks only where `forkAt(j)` says.
 */
const walk = (rand, cfg, n, forkAt) => {
  const out = []
  let pending = undefined
  for (let j = 0; j < n; j++) {
    const next = pick(rand, places)
    if (j === n - 1) {
      const v = pick(rand, items)
      out.push({ text: `end ${v}`, reply: `report ${v}` })
    } else if (pending !== undefined) {
      out.push({ text: `${pending}, next ${next}`, reply: `get ${next}` })
      pending = undefined
    } else if (j < n - 2 && forkAt(j)) {
      const sub = walk(rand, cfg, cfg.subSteps, () => false)
      out.push({ text: `fork ${next}`, reply: `spawn ${next}`, sub })
      pending = `sub ${sub[sub.length - 1].reply.split(" ")[1]}`
    } else if (j < n - 2 && rand() < cfg.itemRate) {
      const v = pick(rand, items)
      out.push({ text: `next ${next}, item ${v}`, reply: `take ${v}` })
      pending = `took ${v}`
    } else {
      out.push({ text: `next ${next}`, reply: `get ${next}` })
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
  return walk(rand, cfg, cfg.steps, forkAt)
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

/**
 * Credit of a reply: the fraction of the expected words it has in place (extra words count
 * against it), so a model that has learned the verbs but not yet the words earns half, and
 * executions differ in score, which group-relative advantages need.
 */
export const creditOf = (reply, expected) => {
  const want = expected.split(" ")
  const got = reply.split(" ")
  return want.filter((w, i) => got[i] === w).length / Math.max(want.length, got.length)
}

const COMMAND = "(get|take|spawn|report) [a-z]+"

/** A well-formed reply: one command, or a note holding one. */
export const wellFormed = (reply) => new RegExp(`^(note )?${COMMAND}$`).test(reply)

/** The scripted oracle: the right reply to a context, from its last message(s) alone. */
export const oracleReply = (messages) => {
  const last = messages[messages.length - 1]
  if (last.role === "user" && last.content === compactRequest) return `note ${oracleReply(messages.slice(0, -1))}`
  const text = last.content
  const rules = [
    [/item (\w+)$/, "take"],
    [/^fork (\w+)$/, "spawn"],
    [/^end (\w+)$/, "report"],
    [new RegExp(`^${COMMAND}$`), ""],
    [/next (\w+)$/, "get"]
  ]
  for (const [pattern, verb] of rules) {
    const m = pattern.exec(text)
    if (m) return verb === "" ? text : `${verb} ${m[1]}`
  }
  return "get ash"
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
