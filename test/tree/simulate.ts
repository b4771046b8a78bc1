/**
 * Test helpers: a fast-check arbitrary of agent executions (main calls, retries, subagents
 * with summaries, compactions, custom-role calls) over a tiny vocabulary so that chance
 * matches between branches are common, and a naive token-by-token trie that serves as the
 * reference for tree contents, generated masks, path counts and leaf roles; and the
 * gateway-to-tree pipeline (encoder, JSON wire form, decoder).
 */
import { Schema } from "effect"
import fc from "fast-check"
import { expect } from "vitest"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import { CallRecordJson, type CallRecord, type ModelCall, untempered } from "../../src/tree/record.ts"
import { compareRoles } from "../../src/tree/role.ts"
import type { TrajectoryTree } from "../../src/tree/tree.ts"

const token = fc.integer({ min: 0, max: 4 })
const tokens = (max: number) => fc.array(token, { maxLength: max })

const step = fc.record({
  kind: fc.constantFrom("main", "main", "main", "retry", "subagent", "subagent", "subagent-summary", "compact", "custom"),
  output: tokens(6),
  tool: tokens(5),
  keepSystem: fc.boolean(),
  version: fc.integer({ min: 0, max: 3 }),
  logprob: fc.integer({ min: -8, max: 0 })
})

/** Arbitrary executions of up to `maxCalls` calls. */
export const executionArb = (maxCalls = 24) => fc.array(step, { minLength: 1, maxLength: maxCalls }).map(simulate)

const SYSTEM = [7, 8, 7]

/** Plays the steps as a harness would and returns its model calls in completion order. */
export const simulate = (steps: ReadonlyArray<StepValue>): Array<ModelCall> => {
  const calls: Array<ModelCall> = []
  let main = [...SYSTEM, 6]
  let lastMainPrompt: Array<number> | undefined
  let sub: Array<number> | undefined
  const call = (role: string, prompt: ReadonlyArray<number>, s: StepValue): Array<number> => {
    const output = s.output
    calls.push({
      callId: `c${calls.length}`,
      role,
      prompt: Int32Array.from(prompt),
      output: Int32Array.from(output),
      logprobs: Float32Array.from(output, (t, i) => s.logprob / 4 - t / 8 - i / 16),
      versions: Int32Array.from(output, () => s.version),
      sampling: untempered,
      finishReason: "stop",
      startedAt: calls.length,
      finishedAt: calls.length + 0.5,
      toolCalls: output.length > 0 ? { [`t${calls.length}`]: `{"tokens":${output.length}}` } : {}
    })
    return [...prompt, ...output]
  }
  for (const s of steps) {
    switch (s.kind) {
      case "main":
      case "retry": {
        const prompt = s.kind === "retry" && lastMainPrompt !== undefined ? lastMainPrompt : main
        lastMainPrompt = prompt
        main = [...call("main", prompt, s), ...s.tool]
        break
      }
      case "subagent":
        sub = [...call("subagent", sub ?? [...main, ...s.tool], s), 5]
        break
      case "subagent-summary":
        if (sub === undefined) break
        main = [...main, ...call("subagent-summary", [...sub, 6], s).slice(sub.length + 1)]
        sub = undefined
        break
      case "compact": {
        const summary = call("main-summary", [...main, ...s.tool], s).slice(main.length + s.tool.length)
        main = [...(s.keepSystem ? SYSTEM : []), ...summary]
        lastMainPrompt = undefined
        break
      }
      case "custom":
        call("judge", [...main, ...s.tool], s)
        break
    }
  }
  return calls
}

export interface StepValue {
  readonly kind: string
  readonly output: ReadonlyArray<number>
  readonly tool: ReadonlyArray<number>
  readonly keepSystem: boolean
  readonly version: number
  readonly logprob: number
}

/** A node of the naive reference trie: one token. */
export interface NaiveNode {
  readonly token: number
  readonly depth: number
  readonly children: Map<number, NaiveNode>
  /** Lowest (version, logprob) among calls that generated this token; version -1 = context. */
  version: number
  logprob: number
  /** Best role among calls ending here. */
  endRole: string | undefined
}

/** The naive trie of a list of calls: every token of every call inserted one by one. */
export const naiveTrie = (calls: ReadonlyArray<ModelCall>): NaiveNode => {
  const root: NaiveNode = { token: -1, depth: -1, children: new Map(), version: -1, logprob: 0, endRole: undefined }
  for (const c of calls) {
    const sequence = [...c.prompt, ...c.output]
    let node = root
    sequence.forEach((t, d) => {
      let child = node.children.get(t)
      if (child === undefined) {
        child = { token: t, depth: d, children: new Map(), version: -1, logprob: 0, endRole: undefined }
        node.children.set(t, child)
      }
      node = child
      const j = d - c.prompt.length
      if (j >= 0) {
        const version = c.versions[j]!
        const logprob = Math.fround(c.logprobs[j]!)
        if (node.version < 0 || version < node.version || (version === node.version && logprob < node.logprob)) {
          node.version = version
          node.logprob = logprob
        }
      }
    })
    if (sequence.length > 0 && (node.endRole === undefined || compareRoles(c.role, node.endRole) < 0)) node.endRole = c.role
  }
  return root
}

/** Nodes of the naive trie in canonical preorder (children by token), root excluded. */
export const naivePreorder = (root: NaiveNode): Array<NaiveNode> => {
  const out: Array<NaiveNode> = []
  const visit = (node: NaiveNode) => {
    for (const t of [...node.children.keys()].sort((a, b) => a - b)) {
      const child = node.children.get(t)!
      out.push(child)
      visit(child)
    }
  }
  visit(root)
  return out
}

/** Per naive node: the leaves below it (1 for a leaf), i.e. the root-to-leaf paths through it. */
export const naiveLeafCounts = (root: NaiveNode): Map<NaiveNode, number> => {
  const counts = new Map<NaiveNode, number>()
  for (const node of naivePreorder(root).reverse()) {
    counts.set(node, node.children.size === 0 ? 1 : [...node.children.values()].reduce((a, c) => a + counts.get(c)!, 0))
  }
  return counts
}

/** Deterministic shuffle with duplicates, driven by fast-check's seed list. */
export const deliveryOrder = <A>(items: ReadonlyArray<A>, seeds: ReadonlyArray<number>): Array<A> => {
  const out = [...items]
  seeds.forEach((s, i) => {
    if (s % 3 === 0 && out.length > 0) out.push(out[s % out.length]!)
    const a = (s >>> 3) % out.length
    const b = (i * 7 + s) % out.length
    ;[out[a], out[b]] = [out[b]!, out[a]!]
  })
  return out
}

const ids = { run: "r", task: "t", execution: "e" }
const encodeJson = Schema.encodeSync(CallRecordJson)
const decodeJson = Schema.decodeUnknownSync(CallRecordJson)

/** Encodes calls as the gateway does and sends them through the JSON wire form. */
export const wireRecords = (calls: ReadonlyArray<ModelCall>, chunkTokens = 64): Array<CallRecord> => {
  const encoder = new DeltaEncoder(ids, { chunkTokens })
  return calls.map((c) => decodeJson(encodeJson(encoder.encode(c))))
}

export const build = (records: ReadonlyArray<CallRecord>, chunkTokens = 64): DeltaDecoder => {
  const decoder = new DeltaDecoder(ids.execution, { chunkTokens })
  for (const record of records) expect(decoder.add(record).rejected).toEqual([])
  expect(decoder.pending()).toEqual([])
  return decoder
}

/** Every token of the tree in canonical preorder: depth, id, version, log-prob. */
export const listing = (tree: TrajectoryTree): Array<[number, number, number, number]> => {
  const rows: Array<[number, number, number, number]> = []
  for (const node of tree.preorder()) {
    const tokens = tree.tokensOf(node)
    const versions = tree.versionsOf(node)
    const logprobs = tree.logprobsOf(node)
    tokens.forEach((t, j) => rows.push([tree.depthOf(node) + j, t, versions[j]!, logprobs[j]!]))
  }
  return rows
}
