/**
 * The long suite's world, shared by its harness and its scorer (no Gyre imports: the suite is
 * a black box that only talks HTTP to OPENAI_BASE_URL).
 *
 * A task is a scripted coding-agent session, generated from the task id: a large system
 * prompt, a task statement, then `calls` main decisions, each answered by a tool output of
 * thousands of tokens (a file, a test log, grep hits, a diff). The script decides everything
 * about the execution's shape; the model's replies only fill the assistant turns:
 *
 * - retries that branch: at `retries` scripted decisions the agent reverts the last `back`
 *   decisions and re-sends the prefix it had then, continued by a revert notice;
 * - subagents that fork: at `subagents` scripted decisions a subagent (role `subagent`, its
 *   last call `subagent-summary`) starts from the parent's messages and its reply, runs
 *   `subCalls` calls, and its report goes back to the parent inside the next tool output;
 * - compaction: before a main decision whose context could pass `compactAt` x `window` tokens,
 *   a summary call (role `main-summary`), then a new history [system, summary + observation].
 *
 * Context sizes are judged by an upper bound that counts every reply as the longest it can
 * be (`outputTokens` tokens; a reply quoted in a later message is cut to `outputTokens`
 * printable characters), so the script is the same whatever the model writes. Every observation ends with one line naming
 * a module (`FAILED: parser`); the expected reply is a verb fixed by the kind of observation
 * and that module (`fix parser`): the score depends on the model's replies in a learnable way.
 * All text is ASCII: with the byte-level tokenizer one byte is one token.
 */

/** FNV-1a of a string: the task id's seed. */
export const seedOf = (text) => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0
  return h
}

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

/** A scale: a positive number or a fraction `a/b`. */
const parseScale = (text) => {
  const m = /^\s*([0-9.]+)\s*(?:\/\s*([0-9.]+)\s*)?$/.exec(text)
  const v = m === null ? NaN : Number(m[1]) / (m[2] === undefined ? 1 : Number(m[2]))
  if (!Number.isFinite(v) || v <= 0) throw new Error(`LONG_SCALE=${text}: expected a positive number or a fraction such as 1/16`)
  return v
}

/** Per-message template tokens the context bound allows (role and end markers, with room to spare). */
export const MESSAGE_OVERHEAD = 4
/** Tokens of the prompt outside the messages (bos, the generation prompt), with room to spare. */
const PROMPT_OVERHEAD = 8

/**
 * The configuration of a task's script and its harness, from the environment. `LONG_SCALE` (s)
 * scales the defaults: calls, system, tool and output tokens by s, the window by s^2 (the
 * context grows by calls x tokens per call, so a scaled run compacts about as often as a full one),
 * but never below what a compacted history needs to go on (a subagent and three more steps).
 */
export const configFrom = (env) => {
  const scale = env.LONG_SCALE ? parseScale(env.LONG_SCALE) : 1
  const num = (name, fallback, min) => {
    const text = env[name]
    if (text === undefined || text === "") return fallback
    const v = Number(text)
    if (!Number.isFinite(v) || v < min) throw new Error(`${name}=${text}: expected a number >= ${min}`)
    return v
  }
  const int = (name, full, min, power = 1) => Math.floor(num(name, Math.max(min, Math.round(full * scale ** power)), min))
  const policy = env.LONG_POLICY || "model"
  if (policy !== "model" && policy !== "oracle") throw new Error(`LONG_POLICY=${policy}: expected model or oracle`)
  const cfg = {
    scale,
    calls: int("LONG_CALLS", 300, 4),
    systemTokens: int("LONG_SYSTEM_TOKENS", 8192, 256),
    toolTokens: int("LONG_TOOL_TOKENS", 3072, 64),
    outputTokens: int("LONG_OUTPUT_TOKENS", 300, 8),
    window: 0,
    compactAt: num("LONG_COMPACT_AT", 0.9, 0.1),
    retries: int("LONG_RETRIES", 3, 0, 0),
    back: int("LONG_RETRY_BACK", 2, 1, 0),
    subagents: int("LONG_SUBAGENTS", 2, 0, 0),
    subCalls: int("LONG_SUB_CALLS", 6, 2),
    temperature: num("LONG_TEMPERATURE", 1, 0),
    ignoreEos: (env.LONG_IGNORE_EOS ?? "1") !== "0",
    model: env.LONG_MODEL || "gyre",
    policy
  }
  if (cfg.compactAt > 1) throw new Error(`LONG_COMPACT_AT=${cfg.compactAt}: expected at most 1`)
  // What a compacted history needs to go on: a subagent and a few steps before the next compaction.
  const least = Math.ceil((freshBound(cfg) + 3 * stepBound(cfg) + subagentBound(cfg)) / cfg.compactAt)
  cfg.window = Math.floor(num("LONG_WINDOW", Math.max(least, Math.round(524288 * scale ** 2)), 1024))
  if (cfg.window < least) {
    throw new Error(`LONG_WINDOW=${cfg.window}: too small for the system prompt (${cfg.systemTokens}), a compacted history and a subagent's ${cfg.subCalls} calls of ${maxObservation(cfg)} tool tokens; raise LONG_WINDOW or lower LONG_TOOL_TOKENS`)
  }
  return cfg
}

// ---- context bounds -----------------------------------------------------------------------

/** The longest observation (tool output) of a configuration, in tokens (bytes). */
export const maxObservation = (cfg) => Math.ceil(1.2 * cfg.toolTokens) + 160
/** Upper bound of the tokens a reply takes in a prompt as an assistant turn (its raw tokens, and an end marker). */
const replyBound = (cfg) => cfg.outputTokens + 1
/** ... and quoted in a message (`quote`). */
const quotedBound = (cfg) => cfg.outputTokens
/**
 * A reply as another message quotes it (a summary, a subagent's report): printable ASCII
 * (anything else becomes `?`), at most `outputTokens` characters, so its size is bounded
 * whatever the model wrote.
 */
export const quote = (reply, cfg) => reply.replace(/[^\x20-\x7e\n]/g, "?").slice(0, cfg.outputTokens)
/** What one main decision adds at most: its reply and the next observation (which may quote a subagent's report). */
const stepBound = (cfg) => replyBound(cfg) + maxObservation(cfg) + quotedBound(cfg) + 2 * MESSAGE_OVERHEAD + 64
/** What a subagent adds to its parent's context at most. */
const subagentBound = (cfg) => cfg.subCalls * stepBound(cfg) + 256
/** A history just after compaction: the system prompt and the summary message. */
const freshBound = (cfg) => cfg.systemTokens + 2 * quotedBound(cfg) + maxObservation(cfg) + 256 + PROMPT_OVERHEAD

const bytes = (text) => text.length // ASCII only

// ---- text ---------------------------------------------------------------------------------

export const modules = ["parser", "lexer", "cache", "router", "codec", "buffer", "config", "logger", "session", "storage", "metrics", "planner", "loader", "server", "client", "worker"]

/** Kinds of observation: the tool that produced it, the verb of the reply it asks for, and its last line. */
export const kinds = [
  { tool: "read_file", verb: "edit", last: (m) => `// end of src/${m}.ts` },
  { tool: "run_tests", verb: "fix", last: (m) => `FAILED: ${m}` },
  { tool: "grep", verb: "open", last: (m) => `best match: ${m}` },
  { tool: "git_diff", verb: "test", last: (m) => `applied to: ${m}` }
]

const pick = (rand, xs) => xs[Math.floor(rand() * xs.length)]
const ident = (rand) => `${pick(rand, ["get", "set", "load", "parse", "emit", "check", "merge", "flush", "read", "write"])}${pick(rand, ["Token", "Entry", "Block", "Frame", "Header", "Range", "Batch", "State", "Key", "Node"])}`
const lineNo = (rand) => 1 + Math.floor(rand() * 900)

/** One line of a tool's body. */
const bodyLine = (tool, rand) => {
  const m = pick(rand, modules)
  switch (tool) {
    case "read_file":
      return pick(rand, [
        () => `export function ${ident(rand)}(input: ${pick(rand, ["string", "Uint8Array", "number", "Entry"])}, limit = ${lineNo(rand)}) {`,
        () => `  const ${ident(rand)} = ${m}.${ident(rand)}(input, ${lineNo(rand)})`,
        () => `  if (${ident(rand)}.length > limit) throw new RangeError("${m}: over ${lineNo(rand)} items")`,
        () => `  for (let i = 0; i < ${lineNo(rand)}; i++) out.push(${ident(rand)}(i))`,
        () => `  return { ok: true, value: ${ident(rand)} }`,
        () => `}`,
        () => `import { ${ident(rand)} } from "./${m}.ts"`
      ])()
    case "run_tests":
      return pick(rand, [
        () => `PASS tests/${m}.test.ts (${lineNo(rand)} ms)`,
        () => `  ok ${ident(rand)} handles ${pick(rand, ["empty", "large", "unicode", "nested", "partial"])} input (${lineNo(rand) % 90} ms)`,
        () => `    at ${ident(rand)} (src/${m}.ts:${lineNo(rand)}:${lineNo(rand) % 80})`,
        () => `  expected ${lineNo(rand)} to equal ${lineNo(rand)}`
      ])()
    case "grep":
      return `src/${m}.ts:${lineNo(rand)}:  const ${ident(rand)} = ${ident(rand)}(${pick(rand, modules)}, ${lineNo(rand)})`
    default:
      return pick(rand, [
        () => `@@ -${lineNo(rand)},${lineNo(rand) % 20} +${lineNo(rand)},${lineNo(rand) % 20} @@ export function ${ident(rand)}`,
        () => `-  return ${ident(rand)}(input)`,
        () => `+  return ${ident(rand)}(input, ${lineNo(rand)})`,
        () => `   const ${ident(rand)} = ${m}.${ident(rand)}()`,
        () => `diff --git a/src/${m}.ts b/src/${m}.ts`
      ])()
  }
}

/** An observation of about `tokens` bytes (0.8 to 1.2 times): a header, body lines, and the key line. */
const observation = (rand, cfg, head) => {
  const kind = pick(rand, kinds)
  const module = pick(rand, modules)
  const target = Math.round(cfg.toolTokens * (0.8 + 0.4 * rand()))
  const lines = [`${head}$ ${kind.tool} ${kind.tool === "read_file" ? `src/${module}.ts` : pick(rand, modules)}`]
  let size = lines[0].length
  while (size < target) {
    const line = bodyLine(kind.tool, rand)
    lines.push(line)
    size += line.length + 1
  }
  lines.push(kind.last(module))
  return { text: lines.join("\n"), expected: `${kind.verb} ${module}` }
}

const SYSTEM_CORE = [
  "You are Forge, an autonomous software engineer working in a TypeScript repository. You run a loop: read the latest tool output, decide the next action, and issue exactly one command. Reply with the command alone on the first line: `edit MODULE`, `fix MODULE`, `open MODULE`, `test MODULE`, `report MODULE` or `summary MODULE`. The verb follows from the kind of the latest output (a file: edit; a test log: fix; grep hits: open; a diff: test; a request to report: report; a request to summarise: summary) and MODULE is the module named on its last line.",
  "# Tools\nread_file {\"path\": string, \"start\"?: integer, \"end\"?: integer}: the file's text with line numbers.\nrun_tests {\"filter\"?: string}: runs the test suite (vitest) and prints every result; failures come last.\ngrep {\"pattern\": string, \"path\"?: string}: matching lines as path:line: text.\ngit_diff {\"staged\"?: boolean}: the working tree's changes as a unified diff.\nwrite_file {\"path\": string, \"text\": string}: replaces a file.\nspawn_subagent {\"task\": string}: a subagent with a copy of your context works on the task and reports back.",
  "# Working rules\n- Keep changes small and focused; one module at a time.\n- Never edit tests to make them pass; fix the code under test.\n- Run the tests after every edit; read the failures from the bottom of the log.\n- When the context is nearly full you will be asked for a summary: name the module you are working on.\n- A subagent reports in one line; trust its report and continue.\n- Do not explain your reasoning in the reply: the command is parsed from its first line.",
  "# Code style\n- Strict TypeScript, no any; prefer readonly data and pure functions.\n- Errors are values: return { ok: false, error } instead of throwing across module boundaries.\n- Names say what a thing is; comments say why, not what.\n- Imports run one way: config -> storage -> codec -> parser -> planner -> server.\n- Every exported function has a test in tests/<module>.test.ts."
]

/** The system prompt of a task: the fixed instructions, then a repository map up to `systemTokens` bytes. */
export const systemPromptOf = (taskId, cfg) => {
  const rand = generator(seedOf(`system/${taskId}`))
  const parts = []
  let size = 0
  for (const part of SYSTEM_CORE) {
    if (size + part.length + 2 > cfg.systemTokens) break
    parts.push(part)
    size += part.length + 2
  }
  const map = ["# Repository map"]
  size += map[0].length + 1
  while (size < cfg.systemTokens) {
    const line = `src/${pick(rand, modules)}/${ident(rand)}.ts: ${lineNo(rand)} lines; exports ${ident(rand)}, ${ident(rand)}`
    map.push(line)
    size += line.length + 1
  }
  parts.push(map.join("\n"))
  return parts.join("\n\n").slice(0, cfg.systemTokens)
}

export const compactRequest = (m) => `The context is nearly full. Summarise your progress for a fresh context: on the first line write summary and the module you are working on.\nworking on: ${m}`
export const reportRequest = (m) => `Report to the parent agent now: on the first line write report and the module you checked.\nchecked: ${m}`

// ---- the script ---------------------------------------------------------------------------

/** Main decisions where something scripted happens: `count` of them spread evenly over `calls` (offset `shift` of a slot). */
const spread = (count, calls, shift) => new Set(Array.from({ length: count }, (_, i) => Math.min(calls - 2, Math.max(1, Math.round(((i + shift) * calls) / count)))))

/**
 * Runs a task's script. `ask(messages, call)` answers one model call (`call`: `{id, role,
 * expected, fresh}`; `fresh`: the first call of a new history) with the reply text; the script
 * never looks at it except to put it into the next messages. Decision ids: `m<j>` (main),
 * `s<k>.<i>` (the k-th subagent), `n<j>` (compaction before main decision j). Returns counts.
 */
export const runScript = async (taskId, cfg, ask) => {
  const rand = generator(seedOf(taskId))
  const system = { message: { role: "system", content: systemPromptOf(taskId, cfg) } }
  system.bound = bytes(system.message.content) + MESSAGE_OVERHEAD
  const entry = (message, bound = bytes(message.content)) => ({ message, bound: bound + MESSAGE_OVERHEAD })
  const boundOf = (history) => history.reduce((n, e) => n + e.bound, PROMPT_OVERHEAD)
  const reply = (text) => entry({ role: "assistant", content: text }, replyBound(cfg))
  const tool = (id, text) => entry({ role: "tool", tool_call_id: `call_${id}`, content: text })
  const stats = { calls: 0, main: 0, retries: 0, subagents: 0, subagentCalls: 0, compactions: 0 }
  let fresh = true
  const call = async (history, id, role, expected) => {
    stats.calls++
    const text = await ask(history.map((e) => e.message), { id, role, expected, fresh })
    fresh = false
    return text
  }

  const first = observation(rand, cfg, `Task: the test suite of this repository fails. Find the cause, fix it, and keep every other test passing.\n`)
  let history = [system, entry({ role: "user", content: first.text })]
  let expected = first.expected
  const snapshots = [] // main decision j -> the history it was sent with
  let segmentStart = 0
  let pendingRetries = 0
  const retryAt = spread(cfg.retries, cfg.calls, 1 - 1 / (cfg.retries + 1))
  const forkAt = spread(cfg.subagents, cfg.calls, 0.5)
  for (let j = 0; j < cfg.calls; j++) {
    const forks = forkAt.has(j)
    if (j > segmentStart && boundOf(history) + stepBound(cfg) + (forks ? subagentBound(cfg) : 0) > cfg.compactAt * cfg.window) {
      const m = pick(rand, modules)
      const summary = await call([...history, entry({ role: "user", content: compactRequest(m) })], `n${j}`, "main-summary", `summary ${m}`)
      stats.compactions++
      // The summary is model text: bounded by the longest it can be, not measured (the script must not depend on it).
      const last = history[history.length - 1]
      const head = "Summary of the work so far (the earlier context was dropped):\n"
      const tail = "\n\nLatest tool output:\n"
      const text = `${head}${quote(summary, cfg)}${tail}${last.message.content}`
      history = [system, entry({ role: "user", content: text }, bytes(head) + quotedBound(cfg) + bytes(tail) + last.bound - MESSAGE_OVERHEAD)]
      fresh = true
      segmentStart = j
    }
    if (retryAt.has(j)) pendingRetries++
    if (pendingRetries > 0 && j - cfg.back >= segmentStart) {
      // Revert: the history decision j - back was sent with, continued by a notice instead of its reply.
      pendingRetries--
      stats.retries++
      const obs = observation(rand, cfg, `The last ${cfg.back} changes broke the build and were reverted (git reset --hard). Try again from here.\n`)
      history = [...snapshots[j - cfg.back], entry({ role: "user", content: obs.text })]
      expected = obs.expected
    }
    snapshots[j] = history
    const text = await call(history, `m${j}`, "main", expected)
    stats.main++
    history = [...history, reply(text)]
    const report = forks ? await subagent(history, stats.subagents++) : undefined
    if (j === cfg.calls - 1) break
    const obs = observation(rand, cfg, "")
    if (report === undefined) history = [...history, tool(`m${j}`, obs.text)]
    else {
      // The report is model text: its bound, not its length, goes into the history's bound.
      const head = "Subagent report:\n"
      const text = `${head}${quote(report, cfg)}\n\n${obs.text}`
      history = [...history, entry({ role: "tool", tool_call_id: `call_m${j}`, content: text }, bytes(head) + quotedBound(cfg) + 2 + bytes(obs.text))]
    }
    expected = obs.expected
  }
  return stats

  /** A subagent forked from the parent's history (ending with the parent's reply); returns its report. */
  async function subagent(parent, k) {
    const task = observation(rand, cfg, `You are a subagent. Check one module for the parent agent, then report.\n`)
    let history = [...parent, entry({ role: "user", content: task.text })]
    let expected = task.expected
    for (let i = 0; ; i++) {
      const last = i === cfg.subCalls - 1
      if (last) {
        const m = pick(rand, modules)
        history = [...history, entry({ role: "user", content: reportRequest(m) })]
        expected = `report ${m}`
      }
      stats.subagentCalls++
      const text = await call(history, `s${k}.${i}`, last ? "subagent-summary" : "subagent", expected)
      if (last) return text
      const obs = observation(rand, cfg, "")
      history = [...history, reply(text), tool(`s${k}.${i}`, obs.text)]
      expected = obs.expected
    }
  }
}

/** The expected reply of every decision of a task's script, by decision id (a dry run). */
export const expectedReplies = async (taskId, cfg) => {
  const expected = new Map()
  await runScript(taskId, cfg, async (_, c) => {
    expected.set(c.id, c.expected)
    return c.expected
  })
  return expected
}

/** The verb of each key line (the last line of a prompt's last message) and the module it names. */
const KEY_LINES = [
  [/^\/\/ end of src\/(\w+)\.ts$/, "edit"],
  [/^FAILED: (\w+)$/, "fix"],
  [/^best match: (\w+)$/, "open"],
  [/^applied to: (\w+)$/, "test"],
  [/^checked: (\w+)$/, "report"],
  [/^working on: (\w+)$/, "summary"]
]

/** The right reply to a prompt, read from its last line alone: what the model has to learn to infer. */
export const oracleReply = (messages) => {
  const line = messages[messages.length - 1].content.split("\n").pop()
  for (const [pattern, verb] of KEY_LINES) {
    const m = pattern.exec(line)
    if (m !== null) return `${verb} ${m[1]}`
  }
  return ""
}

/**
 * Credit of a reply, judged on its first line: 0.9 x the fraction of the expected words in
 * place (extra words count against it: a model that has the verbs but not the modules earns
 * half of it) + 0.1 x its form, the share of the expected reply's length that it fills with
 * lowercase letters and spaces. The form part is what separates the replies of an untrained
 * model (random bytes almost never hold a right word), so its calls' rewards differ and a
 * group's advantages are not all zero; it rewards writing a command-shaped line.
 */
export const creditOf = (reply, expected) => {
  const line = reply.split("\n")[0]
  const want = expected.split(" ")
  const got = line.trim().split(/ +/)
  const words = want.filter((w, i) => got[i] === w).length / Math.max(want.length, got.length)
  const form = [...line.slice(0, expected.length)].filter((c) => /[a-z ]/.test(c)).length / expected.length
  return 0.9 * words + 0.1 * form
}
