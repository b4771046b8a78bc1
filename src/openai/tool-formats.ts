/**
 * Tool-call formats: how a model writes its calls, read back into OpenAI tool calls while
 * the text is still being generated, and written out for a turn the gateway did not generate.
 *
 *   hermes        <tool_call>{"name": "f", "arguments": {...}}</tool_call>   (Hermes, Qwen2.5, Qwen3)
 *   qwen3-coder   <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
 *   llama3-json   {"name": "f", "parameters": {...}}   the whole turn, maybe after <|python_tag|>, calls split by ";"
 *   mistral       [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]   or [TOOL_CALLS]f[ARGS]{...}
 *
 * JSON calls take their arguments from `"arguments"` or `"parameters"` (a JSON object as
 * written, or a string holding JSON); a call without either has `{}`. Qwen3-Coder's
 * parameters become a JSON object, each value typed by the tool's schema (`string` as
 * written, numbers, booleans, objects and arrays parsed; a value that does not parse stays a
 * string).
 *
 * `scan(text, final)` reads a turn's text (with the format's marker tokens kept) into content
 * and calls. While generating (`final` false) it reads what is decided: a call counts from
 * the moment its name is complete, its arguments are the text so far, and everything from a
 * block that may still become a call is held back; each partial reading's content and each
 * call's arguments are prefixes of the final ones, so they can be streamed as deltas. A block
 * that turns out not to be a call (no name, not JSON) is content.
 */
import { nuid } from "@nats-io/transport-node"
import { randomBytes } from "node:crypto"
import { scanObject, skipSpace, valueEnd, type Member } from "./json-scan.ts"
import type { ToolDefinition } from "./messages.ts"

export const TOOL_FORMATS = ["hermes", "qwen3-coder", "llama3-json", "mistral"] as const
export type ToolFormatName = (typeof TOOL_FORMATS)[number]

export interface ScannedCall {
  readonly name: string
  /** JSON text of the arguments (while generating: a prefix of the final text). */
  readonly arguments: string
  /** The call as the model wrote it. */
  readonly raw: string
}

export interface ScannedText {
  /** Text outside the calls (while generating: what can no longer become part of a call). */
  readonly content: string
  readonly calls: ReadonlyArray<ScannedCall>
}

/** A call to write out: its name and arguments (JSON text). */
export interface CallText {
  readonly name: string
  readonly arguments: string
}

export interface ToolFormat {
  readonly name: ToolFormatName
  /** How Gyre's template tells the model to call (the last line of its tools turn). */
  readonly howToCall: string
  /** Strings a call starts with: a trailing prefix of one is held back while streaming. */
  readonly openers: ReadonlyArray<string>
  /** Special tokens the parser must see in the text (kept when the output is decoded). */
  readonly markers: ReadonlyArray<string>
  /** The text that ends one call, where the format has one (a stop for `parallel_tool_calls: false`). */
  readonly closer: string | undefined
  /** The calls of an assistant turn as the model writes them. */
  readonly render: (calls: ReadonlyArray<CallText>) => string
  readonly scan: (text: string, final: boolean, tools: ReadonlyArray<ToolDefinition>) => ScannedText
  /** A new tool-call id of the kind this format's chat templates accept. */
  readonly newCallId: () => string
}

const parsed = (json: string): unknown => {
  try {
    return JSON.parse(json)
  } catch {
    return json
  }
}

/* ---- JSON calls: {"name": ..., "arguments" | "parameters": ...} ---- */

const ARGUMENT_KEYS = new Set(["arguments", "parameters"])

/** The call an object's members spell so far, once its name is complete. */
const jsonCall = (text: string, members: ReadonlyArray<Member>, complete: boolean): CallText | undefined => {
  const name = members.find((m) => m.key === "name")
  if (name === undefined || name.end === undefined || text[name.start] !== '"') return undefined
  const value = JSON.parse(text.slice(name.start, name.end)) as string
  if (value === "") return undefined
  const args = members.find((m) => ARGUMENT_KEYS.has(m.key))
  if (args === undefined) return { name: value, arguments: complete ? "{}" : "" }
  const c = text[args.start]
  if (c === "{" || c === "[") return { name: value, arguments: text.slice(args.start, args.end ?? text.length) }
  if (args.end === undefined) return { name: value, arguments: "" }
  const raw = text.slice(args.start, args.end)
  return { name: value, arguments: c === '"' ? (JSON.parse(raw) as string) : raw }
}

/** A block read at an opener: calls and where it ends, still open, undecided, or plain text. */
type Block =
  | { readonly kind: "calls"; readonly calls: ReadonlyArray<ScannedCall>; readonly end: number }
  | { readonly kind: "open"; readonly calls: ReadonlyArray<ScannedCall> }
  | { readonly kind: "undecided" }
  | { readonly kind: "text" }

/** A JSON call object at `at` (its `{`): the call and where the object ends. */
const objectCall = (text: string, at: number, final: boolean): { readonly call: ScannedCall; readonly end: number | undefined } | "undecided" | "text" => {
  const scan = scanObject(text, at)
  if (scan.kind === "malformed") return "text"
  const call = jsonCall(text, scan.members, scan.kind === "complete")
  if (call === undefined) return scan.kind === "complete" || final ? "text" : "undecided"
  const end = scan.kind === "complete" ? scan.end : undefined
  return { call: { ...call, raw: text.slice(at, end ?? text.length) }, end }
}

/** `text` from `at` is a prefix of `word` (the text may still become it). */
const prefixOf = (text: string, at: number, word: string) => text.length - at < word.length && word.startsWith(text.slice(at))

/** After a block's body ending at `end`: its closer (whitespace then `closer`) or the body's end. */
const closeBlock = (text: string, at: number, end: number, closer: string, calls: ReadonlyArray<ScannedCall>, final: boolean): Block => {
  const i = skipSpace(text, end)
  if (text.startsWith(closer, i)) {
    const blockEnd = i + closer.length
    return { kind: "calls", calls: calls.map((c, k) => (k === calls.length - 1 ? { ...c, raw: text.slice(at, blockEnd) } : c)), end: blockEnd }
  }
  if (!final && (i === text.length || prefixOf(text, i, closer))) return { kind: "open", calls }
  return { kind: "calls", calls, end }
}

/**
 * Reads a text where calls are blocks starting with `opener` (`block` reads one at an
 * index): content is the text between blocks.
 */
const scanBlocks = (text: string, opener: string, block: (at: number) => Block): ScannedText => {
  let content = ""
  const calls: Array<ScannedCall> = []
  let at = 0
  for (let from = 0; ; ) {
    const start = text.indexOf(opener, from)
    if (start < 0) return { content: content + text.slice(at), calls }
    const b = block(start)
    if (b.kind === "text") {
      from = start + opener.length
      continue
    }
    content += text.slice(at, start)
    if (b.kind === "undecided") return { content, calls }
    calls.push(...b.calls)
    if (b.kind === "open") return { content, calls }
    at = from = b.end
  }
}

/* ---- hermes ---- */

const hermesBlock = (text: string, at: number, final: boolean): Block => {
  const i = skipSpace(text, at + "<tool_call>".length)
  if (i === text.length) return final ? { kind: "text" } : { kind: "undecided" }
  if (text[i] !== "{") return { kind: "text" }
  const read = objectCall(text, i, final)
  if (read === "text") return { kind: "text" }
  if (read === "undecided") return { kind: "undecided" }
  if (read.end === undefined) return final ? { kind: "calls", calls: [{ ...read.call, raw: text.slice(at) }], end: text.length } : { kind: "open", calls: [read.call] }
  return closeBlock(text, at, read.end, "</tool_call>", [read.call], final)
}

const jsonCallText = (argumentsKey: string) => (c: CallText) => `{"name": ${JSON.stringify(c.name)}, "${argumentsKey}": ${JSON.stringify(parsed(c.arguments))}}`

const hermes: ToolFormat = {
  name: "hermes",
  howToCall: 'To call a function, write <tool_call>{"name": <function name>, "arguments": <arguments as a JSON object>}</tool_call>.',
  openers: ["<tool_call>"],
  markers: [],
  closer: "</tool_call>",
  render: (calls) => calls.map((c) => `<tool_call>${JSON.stringify({ name: c.name, arguments: parsed(c.arguments) })}</tool_call>`).join("\n"),
  scan: (text, final) => scanBlocks(text, "<tool_call>", (at) => hermesBlock(text, at, final)),
  newCallId: () => `call_${nuid.next()}`
}

/* ---- qwen3-coder ---- */

const FUNCTION = "<function="
const PARAMETER = "<parameter="
const PARAMETER_END = "</parameter>"
const FUNCTION_END = "</function>"
/** What may end a parameter's value (a value's last newline belongs to the markup). */
const VALUE_ENDS = ["\n" + PARAMETER_END, PARAMETER_END, "\n" + PARAMETER, PARAMETER, "\n" + FUNCTION_END, FUNCTION_END]

/** The JSON type a tool's schema gives one parameter, if it says. */
const parameterType = (tools: ReadonlyArray<ToolDefinition>, fn: string, parameter: string): string | undefined => {
  const schema = tools.find((t) => t.function.name === fn)?.function.parameters as { properties?: Record<string, { type?: unknown }> } | undefined
  const type = schema?.properties?.[parameter]?.type
  const first = Array.isArray(type) ? type.find((t) => t !== "null") : type
  return typeof first === "string" ? first : undefined
}

/** A parameter's value as JSON text, by its type (a value that does not parse as that type stays a string). */
const typedValue = (value: string, type: string | undefined): string => {
  if (type === "integer" || type === "number") return /^\s*-?\d+(\.\d+)?([eE][+-]?\d+)?\s*$/.test(value) ? String(Number(value)) : JSON.stringify(value)
  if (type === "boolean") return /^\s*(true|false)\s*$/i.test(value) ? value.trim().toLowerCase() : JSON.stringify(value)
  if (type === "object" || type === "array" || type === "null") {
    const v = parsed(value.trim())
    return typeof v === "string" ? JSON.stringify(value) : JSON.stringify(v)
  }
  return JSON.stringify(value)
}

/** Length of the longest tail of `value` that may still become the end of the value. */
const heldTail = (value: string): number => {
  let held = 0
  for (const end of VALUE_ENDS) {
    for (let k = Math.min(end.length, value.length); k > held; k--) {
      if (value.endsWith(end.slice(0, k))) {
        held = k
        break
      }
    }
  }
  return held
}

/** The `<function=...>` body at `at` (after the name's `>`): its arguments and where `</function>` ends. */
const qwenParameters = (text: string, at: number, fn: string, tools: ReadonlyArray<ToolDefinition>, final: boolean) => {
  const parts: Array<string> = []
  let i = at
  for (;;) {
    i = skipSpace(text, i)
    if (text.startsWith(FUNCTION_END, i)) return { args: `{${parts.join(", ")}}`, end: i + FUNCTION_END.length }
    if (!text.startsWith(PARAMETER, i)) {
      const open = i === text.length || prefixOf(text, i, PARAMETER) || prefixOf(text, i, FUNCTION_END)
      return { args: `{${parts.join(", ")}${final || !open ? "}" : ""}`, end: final || !open ? i : undefined }
    }
    const nameEnd = text.indexOf(">", i)
    if (nameEnd < 0) return { args: `{${parts.join(", ")}${final ? "}" : ""}`, end: final ? text.length : undefined }
    const parameter = text.slice(i + PARAMETER.length, nameEnd)
    const type = parameterType(tools, fn, parameter)
    let valueStart = nameEnd + 1
    if (text[valueStart] === "\n") valueStart++
    const ends = [PARAMETER_END, PARAMETER, FUNCTION_END].map((e) => text.indexOf(e, valueStart)).filter((x) => x >= 0)
    const valueEnd = ends.length === 0 ? undefined : Math.min(...ends)
    const key = `${JSON.stringify(parameter)}: `
    if (valueEnd === undefined) {
      const value = text.slice(valueStart)
      if (final) parts.push(key + typedValue(value.replace(/\n$/, ""), type))
      else if (type === "string") parts.push(key + JSON.stringify(value.slice(0, value.length - heldTail(value))).slice(0, -1))
      return { args: `{${parts.join(", ")}${final ? "}" : ""}`, end: final ? text.length : undefined }
    }
    parts.push(key + typedValue(text.slice(valueStart, valueEnd).replace(/\n$/, ""), type))
    i = text.startsWith(PARAMETER_END, valueEnd) ? valueEnd + PARAMETER_END.length : valueEnd
  }
}

const qwenBlock = (text: string, at: number, final: boolean, tools: ReadonlyArray<ToolDefinition>): Block => {
  const i = skipSpace(text, at + "<tool_call>".length)
  if (!text.startsWith(FUNCTION, i)) return !final && (i === text.length || prefixOf(text, i, FUNCTION)) ? { kind: "undecided" } : { kind: "text" }
  const nameEnd = text.indexOf(">", i)
  const name = text.slice(i + FUNCTION.length, nameEnd < 0 ? text.length : nameEnd)
  if (/[\s<]/.test(name) || (nameEnd >= 0 && name === "")) return { kind: "text" }
  if (nameEnd < 0) return final ? { kind: "text" } : { kind: "undecided" }
  const body = qwenParameters(text, nameEnd + 1, name, tools, final)
  const call = { name, arguments: body.args, raw: text.slice(at, body.end ?? text.length) }
  if (body.end === undefined) return { kind: "open", calls: [call] }
  return closeBlock(text, at, body.end, "</tool_call>", [call], final)
}

const qwenCall = (c: CallText): string => {
  const args = parsed(c.arguments)
  const params =
    typeof args === "object" && args !== null && !Array.isArray(args)
      ? Object.entries(args).map(([k, v]) => `<parameter=${k}>\n${typeof v === "string" ? v : JSON.stringify(v)}\n</parameter>\n`)
      : []
  return `<tool_call>\n<function=${c.name}>\n${params.join("")}</function>\n</tool_call>`
}

const qwen3Coder: ToolFormat = {
  name: "qwen3-coder",
  howToCall:
    "To call a function, write <tool_call>\\n<function=<function name>>\\n<parameter=<parameter name>>\\n<value>\\n</parameter>\\n</function>\\n</tool_call> (one <parameter=...> block per argument).".replaceAll(
      "\\n",
      "\n"
    ),
  openers: ["<tool_call>"],
  markers: [],
  closer: "</tool_call>",
  render: (calls) => calls.map(qwenCall).join("\n"),
  scan: (text, final, tools) => scanBlocks(text, "<tool_call>", (at) => qwenBlock(text, at, final, tools)),
  newCallId: () => `call_${nuid.next()}`
}

/* ---- llama3-json ---- */

const PYTHON_TAG = "<|python_tag|>"

/** Calls written as JSON objects from `at`, separated by whitespace or ";" (the rest of the text). */
const objectCalls = (text: string, at: number, final: boolean): Block => {
  const calls: Array<ScannedCall> = []
  let i = at
  for (;;) {
    if (text[i] !== "{") {
      if (calls.length === 0) return !final && i === text.length ? { kind: "undecided" } : { kind: "text" }
      return { kind: "calls", calls, end: i }
    }
    const read = objectCall(text, i, final)
    if (read === "undecided") return calls.length === 0 ? { kind: "undecided" } : { kind: "open", calls }
    if (read === "text") return calls.length === 0 ? { kind: "text" } : { kind: "calls", calls, end: i }
    calls.push(read.call)
    if (read.end === undefined) return final ? { kind: "calls", calls, end: text.length } : { kind: "open", calls }
    let j = skipSpace(text, read.end)
    if (text[j] === ";") j = skipSpace(text, j + 1)
    if (j === text.length && !final) return { kind: "open", calls }
    i = j
  }
}

const llama3: ToolFormat = {
  name: "llama3-json",
  howToCall: 'To call a function, answer with only {"name": <function name>, "parameters": <arguments as a JSON object>}.',
  openers: [],
  markers: [PYTHON_TAG],
  closer: undefined,
  render: (calls) => calls.map(jsonCallText("parameters")).join("; "),
  scan: (text, final) => {
    let i = skipSpace(text, 0)
    if (text.startsWith(PYTHON_TAG, i)) i = skipSpace(text, i + PYTHON_TAG.length)
    else if (!final && i < text.length && prefixOf(text, i, PYTHON_TAG)) return { content: "", calls: [] }
    const b = objectCalls(text, i, final)
    if (b.kind === "text") return { content: text, calls: [] }
    if (b.kind === "undecided") return { content: "", calls: [] }
    return { content: b.kind === "calls" ? text.slice(b.end).trimStart() : "", calls: b.calls }
  },
  newCallId: () => `call_${nuid.next()}`
}

/* ---- mistral ---- */

const TOOL_CALLS = "[TOOL_CALLS]"
const ARGS = "[ARGS]"

/** `[{call}, {call}]` at `at`. */
const mistralArray = (text: string, at: number, final: boolean): Block => {
  const calls: Array<ScannedCall> = []
  let i = skipSpace(text, at + 1)
  for (;;) {
    if (i === text.length) {
      if (calls.length === 0) return final ? { kind: "text" } : { kind: "undecided" }
      return final ? { kind: "calls", calls, end: i } : { kind: "open", calls }
    }
    if (text[i] === "]" && calls.length > 0) return { kind: "calls", calls, end: i + 1 }
    if (text[i] !== "{") return calls.length === 0 ? { kind: "text" } : { kind: "calls", calls, end: i }
    const read = objectCall(text, i, final)
    if (read === "undecided") return calls.length === 0 ? { kind: "undecided" } : { kind: "open", calls }
    if (read === "text") return calls.length === 0 ? { kind: "text" } : { kind: "calls", calls, end: i }
    calls.push(read.call)
    if (read.end === undefined) return final ? { kind: "calls", calls, end: text.length } : { kind: "open", calls }
    i = skipSpace(text, read.end)
    if (text[i] === ",") i = skipSpace(text, i + 1)
  }
}

/** `name[ARGS]{...}` at `at` (newer Mistral tokenizers). */
const mistralNamed = (text: string, at: number, final: boolean): Block => {
  const m = /^[A-Za-z0-9_.:-]+/.exec(text.slice(at, at + 256))
  if (m === null) return !final && at === text.length ? { kind: "undecided" } : { kind: "text" }
  const argsAt = at + m[0].length
  if (!text.startsWith(ARGS, argsAt)) return !final && (argsAt === text.length || prefixOf(text, argsAt, ARGS)) ? { kind: "undecided" } : { kind: "text" }
  const start = skipSpace(text, argsAt + ARGS.length)
  const end = valueEnd(text, start)
  if (end === "malformed" || (start < text.length && text[start] !== "{")) return { kind: "text" }
  const call = { name: m[0], arguments: text.slice(start, typeof end === "number" ? end : text.length), raw: text.slice(at - TOOL_CALLS.length, typeof end === "number" ? end : text.length) }
  if (typeof end === "number") return { kind: "calls", calls: [call], end }
  return final ? { kind: "calls", calls: [call], end: text.length } : { kind: "open", calls: [call] }
}

const ALPHANUMERIC = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

const mistral: ToolFormat = {
  name: "mistral",
  howToCall: 'To call functions, write [TOOL_CALLS][{"name": <function name>, "arguments": <arguments as a JSON object>}, ...].',
  openers: [TOOL_CALLS],
  markers: [TOOL_CALLS, ARGS],
  closer: undefined,
  render: (calls) => (calls.length === 0 ? "" : `${TOOL_CALLS}[${calls.map(jsonCallText("arguments")).join(", ")}]`),
  scan: (text, final) =>
    scanBlocks(text, TOOL_CALLS, (at) => {
      const i = skipSpace(text, at + TOOL_CALLS.length)
      return text[i] === "[" ? mistralArray(text, i, final) : mistralNamed(text, i, final)
    }),
  // Mistral's chat templates accept 9 alphanumeric characters only
  newCallId: () => Array.from(randomBytes(9), (b) => ALPHANUMERIC[b % ALPHANUMERIC.length]).join("")
}

export const toolFormats: Readonly<Record<ToolFormatName, ToolFormat>> = { hermes, "qwen3-coder": qwen3Coder, "llama3-json": llama3, mistral }

/** The system turn Gyre's template writes to offer the tools, in `format`'s calling convention. */
export const toolsPrompt = (tools: ReadonlyArray<ToolDefinition>, format: ToolFormat = hermes): string =>
  ["# Tools", "", "You may call one or more of these functions. Their signatures (JSON):", "<tools>", ...tools.map((t) => JSON.stringify(t)), "</tools>", "", format.howToCall].join("\n")
