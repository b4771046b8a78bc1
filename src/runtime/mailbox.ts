/**
 * The bookkeeping of one incarnation as plain data (no NATS, no Effect, no clock), so each rule
 * can be tested alone:
 *
 * - `HandledIds`: the dedup window, the ids of handled messages (the last 10 000 in memory, the
 *   last 512 written with each snapshot);
 * - `AnswerCache`: the answers of recent asks by message id (an ask that reuses an id gets the
 *   recorded answer);
 * - `Mailbox`: messages waiting in arrival order, and how many handlers run (at most
 *   `concurrency`);
 * - `AckBook`: which messages are in flight, which wait for the next snapshot before they may
 *   be confirmed (a tell acknowledged, an ask answered), and what is to be handed back when the
 *   incarnation ends without that snapshot.
 *
 * The host (`dispatch.ts`) performs what these decide.
 */

/**
 * Ids of handled messages, oldest first; past `memory` the oldest is forgotten. A ring of ids
 * beside a set: every operation is O(1) (a `Map` whose oldest key is deleted on each insert
 * makes `keys().next()` walk the deleted slots: measured 34 us per message at 10 000 ids).
 */
export class HandledIds {
  readonly #ring: Array<string>
  readonly #set = new Set<string>()
  /** Where the next id goes; with `size === memory`, also the oldest. */
  #next = 0

  constructor(
    readonly memory = 10_000,
    /** How many of the newest ids a snapshot keeps. */
    readonly kept = 512
  ) {
    this.#ring = new Array<string>(memory)
  }

  static from(ids: Iterable<string>, memory?: number, kept?: number): HandledIds {
    const handled = new HandledIds(memory, kept)
    for (const id of ids) handled.remember(id)
    return handled
  }

  has(id: string): boolean {
    return this.#set.has(id)
  }

  remember(id: string): void {
    if (this.#set.has(id)) return
    if (this.#set.size === this.memory) this.#set.delete(this.#ring[this.#next]!)
    this.#ring[this.#next] = id
    this.#set.add(id)
    this.#next = (this.#next + 1) % this.memory
  }

  /** The newest `kept` ids, oldest first: what a snapshot stores. */
  recent(): Array<string> {
    const n = Math.min(this.kept, this.#set.size)
    const start = this.#next - n
    return start >= 0 ? this.#ring.slice(start, this.#next) : [...this.#ring.slice(start + this.memory), ...this.#ring.slice(0, this.#next)]
  }

  get size(): number {
    return this.#set.size
  }
}

/**
 * The answers of recent asks by message id: at most `count` answers and `maxBytes` bytes, the
 * oldest forgotten first (a ring of ids beside a map, O(1) as `HandledIds` is).
 */
export class AnswerCache {
  readonly #ring: Array<string | undefined>
  readonly #answers = new Map<string, Uint8Array>()
  #oldest = 0
  #next = 0
  #bytes = 0

  constructor(
    readonly count = 1024,
    readonly maxBytes = 16 * 1024 * 1024
  ) {
    this.#ring = new Array<string | undefined>(count)
  }

  get(id: string): Uint8Array | undefined {
    return this.#answers.get(id)
  }

  /** Records the answer to `id` (the first one; one larger than `maxBytes` is not kept). */
  record(id: string, answer: Uint8Array): void {
    if (this.#answers.has(id) || answer.length > this.maxBytes) return
    while (this.#answers.size >= this.count || this.#bytes + answer.length > this.maxBytes) this.#forgetOldest()
    this.#ring[this.#next] = id
    this.#next = (this.#next + 1) % this.count
    this.#answers.set(id, answer)
    this.#bytes += answer.length
  }

  #forgetOldest(): void {
    const id = this.#ring[this.#oldest]!
    this.#ring[this.#oldest] = undefined
    this.#oldest = (this.#oldest + 1) % this.count
    this.#bytes -= this.#answers.get(id)!.length
    this.#answers.delete(id)
  }

  get size(): number {
    return this.#answers.size
  }
  get bytes(): number {
    return this.#bytes
  }
}

/** Messages waiting for a handler, in arrival order, and the count of handlers running. */
export class Mailbox<T> {
  #waiting: Array<T> = []
  #busy = 0
  #open = true
  #held = false

  constructor(readonly concurrency: number) {}

  /** Queues `item`; false once the mailbox is closed (the caller hands the item back). */
  offer(item: T): boolean {
    if (!this.#open) return false
    this.#waiting.push(item)
    return true
  }

  /** The next item to handle when a handler slot is free (it then counts as running). */
  take(): T | undefined {
    if (this.#held || this.#busy >= this.concurrency || this.#waiting.length === 0) return undefined
    this.#busy++
    return this.#waiting.shift()
  }

  /** A handler finished: its slot is free again. */
  release(): void {
    if (this.#busy === 0) throw new Error("Mailbox.release without a running handler")
    this.#busy--
  }

  /** While held, `take` starts nothing (a snapshot waits for the running handlers). */
  hold(held: boolean): void {
    this.#held = held
  }

  /** Stops accepting; returns what was waiting, to be handed back. */
  close(): Array<T> {
    this.#open = false
    return this.#waiting.splice(0)
  }

  get open(): boolean {
    return this.#open
  }
  /** Messages waiting. */
  get depth(): number {
    return this.#waiting.length
  }
  /** Handlers running. */
  get busy(): number {
    return this.#busy
  }
}

/** What to do with a tell once handled. */
export type TellSettlement =
  /** acknowledge it now */
  | "ack"
  /** it waits for a snapshot (held); none is due yet */
  | "hold"
  /** it waits for a snapshot (held), and one is due now */
  | "snapshot"

/** What to do with an ask once handled: answer now, or after a snapshot (held). */
export type AskSettlement = "reply" | "snapshot"

/**
 * Acknowledgement bookkeeping. `snapshotEvery` is the persistence setting (snapshot after that
 * many state changes), `undefined` for an actor whose state lives in memory only: then every
 * message is confirmed as soon as it is handled.
 *
 * With persistence, a message whose handler changed the state is confirmed only after the
 * snapshot that holds the change; one that did not is confirmed at once unless changes are
 * waiting (it may be a redelivered copy of one of them). So an acknowledged message is always
 * in the snapshot and a crash re-handles exactly the messages whose effect was lost.
 */
export class AckBook<M> {
  #held: Array<M> = []
  #changes = 0
  readonly #inFlight = new Set<M>()

  constructor(readonly snapshotEvery: number | undefined) {}

  started(m: M): void {
    this.#inFlight.add(m)
  }

  finished(m: M): void {
    this.#inFlight.delete(m)
  }

  /** Messages whose handler is running. */
  get inFlight(): ReadonlySet<M> {
    return this.#inFlight
  }

  /** State changes not yet in a snapshot. */
  get changes(): number {
    return this.#changes
  }

  /** Messages waiting for the next snapshot. */
  get held(): number {
    return this.#held.length
  }

  settleTell(m: M, changedState: boolean): TellSettlement {
    if (this.snapshotEvery === undefined || (!changedState && this.#changes === 0)) return "ack"
    this.#held.push(m)
    if (changedState) this.#changes++
    return this.#changes >= this.snapshotEvery ? "snapshot" : "hold"
  }

  /** An ask that changed the state is answered after the snapshot holding the change. */
  settleAsk(m: M, changedState: boolean): AskSettlement {
    if (this.snapshotEvery === undefined || !changedState) return "reply"
    this.#held.push(m)
    this.#changes++
    return "snapshot"
  }

  /**
   * Takes what the next snapshot covers: whether any state change is to be written, and the
   * messages to confirm once it is. Call it at the moment the state is read for the snapshot.
   */
  takeForSnapshot(): { readonly write: boolean; readonly confirm: ReadonlyArray<M> } {
    const taken = { write: this.#changes > 0, confirm: this.#held }
    this.#held = []
    this.#changes = 0
    return taken
  }

  /**
   * Everything still held or in flight, for handing back when the incarnation ends without
   * writing their snapshot; the book is empty afterwards.
   */
  releaseAll(): Array<M> {
    const all = [...this.#inFlight, ...this.#held]
    this.#inFlight.clear()
    this.#held = []
    this.#changes = 0
    return all
  }
}
