/**
 * How `gyre replay` shows an entry: one human line (time, sequence, actor, type, a one-line
 * summary of the decoded payload) or one JSON line (`--json`: the entry with its decoded
 * payload; typed arrays as plain arrays).
 */
import type { PolicyAction } from "../policy/vocabulary.ts"
import type { PolicyRecord } from "../protocols/scheduler.ts"
import { entryType, type Entry } from "./read.ts"

const WIDTH = 200

/** JSON.stringify's replacer for decoded payloads: typed arrays and bigints become JSON numbers. */
export const plainJson = (_key: string, value: unknown): unknown => {
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return Array.from(value as unknown as ArrayLike<number>)
  if (typeof value === "bigint") return Number(value)
  return value
}

const scalar = (v: unknown): string => {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)))
  if (typeof v === "string") return v.length > 40 ? `${JSON.stringify(v.slice(0, 37))}...` : v === "" || /\s/.test(v) ? JSON.stringify(v) : v
  if (v === null || v === undefined || typeof v === "boolean") return String(v)
  if (ArrayBuffer.isView(v)) return `[${(v as unknown as ArrayLike<number>).length} values]`
  if (Array.isArray(v)) return v.length <= 4 && v.every((x) => typeof x !== "object") ? `[${v.map(scalar).join(",")}]` : `[${v.length}]`
  return `{${fields(v as Record<string, unknown>)}}`
}

/** `key=value` pairs of an object, the tag first. */
export const fields = (o: Record<string, unknown>): string =>
  Object.entries(o)
    .filter(([k]) => k !== "_tag")
    .map(([k, v]) => `${k}=${scalar(v)}`)
    .join(" ")

/** `Tag{key=value ...}`. */
export const tagged = (o: { readonly _tag: string }) => {
  const rest = fields(o as unknown as Record<string, unknown>)
  return rest === "" ? o._tag : `${o._tag}{${rest}}`
}

const actionsText = (actions: ReadonlyArray<PolicyAction>) => (actions.length === 0 ? "" : ` -> ${actions.map(tagged).join(" ")}`)

/** A policy record on one line: index, term, event fields, the actions it produced. */
export const recordSummary = (r: PolicyRecord): string =>
  `#${r.index} term ${r.term}${r.device === undefined ? "" : ` ${r.device}`} ${fields(r.event as unknown as Record<string, unknown>)}${actionsText(r.actions)}`

const summary = (e: Entry): string => {
  if (e.error !== undefined) return `UNDECODABLE: ${e.error.split("\n")[0]}`
  if (e.record !== undefined) return recordSummary(e.record)
  if (e.payload !== null && typeof e.payload === "object" && !Array.isArray(e.payload)) return fields(e.payload as Record<string, unknown>)
  return scalar(e.payload)
}

const clock = (t: Date) => t.toISOString().slice(11, 23)

/** One human line. */
export const entryLine = (e: Entry): string => {
  const who = e.actor !== undefined ? `${e.actor.kind}/${e.actor.id}` : "sys"
  const line = `${clock(e.time)} ${String(e.seq).padStart(7)} ${e.via.padEnd(5)} ${who.padEnd(26)} ${entryType(e).padEnd(18)} ${summary(e)}`
  return line.length > WIDTH ? `${line.slice(0, WIDTH - 3)}...` : line
}

/** One JSON line. */
export const entryJson = (e: Entry): string =>
  JSON.stringify(
    {
      seq: e.seq,
      time: e.time.toISOString(),
      subject: e.subject,
      via: e.via,
      actor: e.actor === undefined ? null : `${e.actor.kind}/${e.actor.id}`,
      type: entryType(e),
      name: e.name,
      msgId: e.msgId ?? null,
      payload: e.payload,
      ...(e.error === undefined ? {} : { error: e.error })
    },
    plainJson
  )
