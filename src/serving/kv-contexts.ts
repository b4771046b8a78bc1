/**
 * The rollout worker's bookkeeping of cached execution contexts: which KV-cache sequences it
 * keeps for each execution, with their tokens, and which one a new prompt can start from.
 *
 * A context is the sequence one `Generate` left behind: `tokens` = its prompt ++ output, of
 * which the first `kvLength` have K/V in the cache (the last sampled token never went through
 * the model). A new call *forks* the context sharing the longest common prefix with its
 * prompt (`bestPrefix`): the whole context when all its K/V is a prefix of the prompt, else
 * the blocks of its shared first tokens (a prefix fork); blocks are shared, copy-on-write,
 * and the call appends only the rest. So a compacted history still starts from the cached
 * system prompt, and a retry that branches mid-turn keeps the turn's shared tokens. The
 * forked context stays, so a later retry from that point, or a subagent forking the same
 * parent, finds it again. Each execution keeps at most
 * `perExecution` contexts (the least recently used go first), and under memory pressure the
 * least recently used context of any execution is dropped. A context added under a request
 * that already has one replaces it.
 *
 * Prefilled again: for each execution the longest context it lost to eviction is remembered
 * (its token array, no copy), so a later prompt's tokens that were in it and are not cached
 * now count as prefilled again (`reprefillOf`).
 *
 * Pure bookkeeping: the caller frees the KV sequences of the contexts this returns.
 */
import { digestOf } from "../tree/hash.ts"

export interface CachedContext {
  readonly execution: string
  /** The Generate request that left it. */
  readonly request: string
  /** Its KV-cache sequence. */
  readonly seq: number
  /** Prompt ++ output of that request. */
  readonly tokens: Int32Array
  /** `tokens[0, kvLength)` have K/V in the cache. */
  readonly kvLength: number
  lastUsed: number
  /** Pins held for a KV hand-off; a pinned context is never evicted. */
  pins: number
}

/** Where a Generate's prompt starts: `length` tokens of an earlier context, with their digest. */
export interface BaseRef {
  readonly length: number
  readonly digest: string
  /** The request whose context it is; absent: the execution's most recent context. */
  readonly request?: string | undefined
}

/** A cached context and how many of its first tokens a prompt shares (`whole`: all of its K/V). */
export interface PrefixMatch {
  readonly context: CachedContext
  readonly length: number
  readonly whole: boolean
}

export type Resolved = { readonly prompt: Int32Array } | { readonly miss: string }

export class ExecutionContexts {
  private readonly byExecution = new Map<string, Array<CachedContext>>()
  /** The longest context each execution lost to eviction. */
  private readonly lost = new Map<string, CachedContext>()
  private clock = 0
  /** Contexts evicted (budget or memory) since the start. */
  evicted = 0

  constructor(readonly perExecution: number) {}

  get executions(): number {
    return this.byExecution.size
  }

  /** Every context, for teardown. */
  all(): Array<CachedContext> {
    return [...this.byExecution.values()].flat()
  }

  /** Executions with cached contexts. */
  ids(): Array<string> {
    return [...this.byExecution.keys()]
  }

  /** The context request `request` of the execution left. */
  find(execution: string, request: string): CachedContext | undefined {
    return this.byExecution.get(execution)?.find((c) => c.request === request)
  }

  /** The execution's most recently added context. */
  latest(execution: string): CachedContext | undefined {
    return this.byExecution.get(execution)?.at(-1)
  }

  /** The full prompt of a request: `base` tokens of a held context, then `delta`; or why not. */
  resolvePrompt(execution: string, base: BaseRef | null, delta: Int32Array): Resolved {
    if (base === null) return { prompt: delta }
    const context = base.request === undefined ? this.latest(execution) : this.find(execution, base.request)
    if (context === undefined) {
      return { miss: base.request === undefined ? "no cached context for the execution" : `no cached context of request ${base.request}` }
    }
    if (base.length > context.tokens.length) return { miss: `base of ${base.length} tokens but the context holds ${context.tokens.length}` }
    const head = context.tokens.subarray(0, base.length)
    if (digestOf(head) !== base.digest) return { miss: "digest of the base differs from the cached context" }
    this.touch(context)
    const prompt = new Int32Array(base.length + delta.length)
    prompt.set(head)
    prompt.set(delta, base.length)
    return { prompt }
  }

  /**
   * The context sharing the longest common prefix with `prompt` in its K/V, and that shared
   * length (at most `prompt.length - 1`: the last prompt token goes through the model); on a
   * tie, one whose whole K/V is shared (`whole`). A part of a context shorter than
   * `minPart` tokens does not count (a prefix fork of less than a block is not worth it).
   */
  bestPrefix(execution: string, prompt: Int32Array, minPart = 1): PrefixMatch | undefined {
    let best: PrefixMatch | undefined
    for (const c of this.byExecution.get(execution) ?? []) {
      const bound = Math.min(c.kvLength, prompt.length - 1)
      if (!beats(bound, bound === c.kvLength, best)) continue // it cannot share more: no compare
      const length = commonPrefix(c.tokens, prompt, bound)
      const whole = length === c.kvLength
      if (length > 0 && (whole || length >= minPart) && beats(length, whole, best)) best = { context: c, length, whole }
    }
    if (best !== undefined) this.touch(best.context)
    return best
  }

  /** Adds a context; returns the contexts it replaced or pushed out of the execution's budget (to free). */
  add(context: Omit<CachedContext, "lastUsed" | "pins">): Array<CachedContext> {
    const entry: CachedContext = { ...context, lastUsed: ++this.clock, pins: 0 }
    const list = this.byExecution.get(entry.execution) ?? []
    const out: Array<CachedContext> = []
    const same = list.find((c) => c.request === entry.request && c.pins === 0)
    if (same !== undefined) {
      list.splice(list.indexOf(same), 1)
      out.push(same)
    }
    list.push(entry)
    this.byExecution.set(entry.execution, list)
    while (list.length > this.perExecution) {
      const victim = oldestUnpinned(list)
      if (victim === undefined) break
      this.evict(victim)
      out.push(victim)
    }
    return out
  }

  /** Drops all of an execution's contexts (pinned ones too: their blocks wait for the unpin). */
  release(execution: string): Array<CachedContext> {
    const list = this.byExecution.get(execution) ?? []
    this.byExecution.delete(execution)
    this.lost.delete(execution)
    return list
  }

  /** Removes and returns the least recently used unpinned context of any execution. */
  evictOldest(): CachedContext | undefined {
    const victim = oldestUnpinned(this.all())
    if (victim !== undefined) this.evict(victim)
    return victim
  }

  /**
   * Tokens of `sequence` past its first `cached` that were K/V of a context the execution lost
   * to eviction: what prefilling it now computes again.
   */
  reprefillOf(execution: string, sequence: Int32Array, cached: number): number {
    const lost = this.lost.get(execution)
    if (lost === undefined) return 0
    return Math.max(0, commonPrefix(lost.tokens, sequence, Math.min(lost.kvLength, sequence.length)) - cached)
  }

  private evict(context: CachedContext): void {
    this.remove(context)
    this.evicted++
    const lost = this.lost.get(context.execution)
    if (lost === undefined || context.kvLength > lost.kvLength) this.lost.set(context.execution, context)
  }

  private remove(context: CachedContext): void {
    const list = this.byExecution.get(context.execution)
    if (list === undefined) return
    const at = list.indexOf(context)
    if (at >= 0) list.splice(at, 1)
    if (list.length === 0) this.byExecution.delete(context.execution)
  }

  private touch(context: CachedContext): void {
    context.lastUsed = ++this.clock
  }
}

const oldestUnpinned = (list: ReadonlyArray<CachedContext>): CachedContext | undefined =>
  list.reduce<CachedContext | undefined>((a, c) => (c.pins > 0 || (a !== undefined && a.lastUsed <= c.lastUsed) ? a : c), undefined)

/** A match of `length` tokens (`whole`: a context's whole K/V) is better than `best`. */
const beats = (length: number, whole: boolean, best: PrefixMatch | undefined): boolean =>
  best === undefined || length > best.length || (length === best.length && whole && !best.whole)

/** The length of the common prefix of `a` and `b`, at most `n`. */
const commonPrefix = (a: Int32Array, b: Int32Array, n: number): number => {
  let i = 0
  while (i < n && a[i] === b[i]) i++
  return i
}
