/**
 * Flag parsing shared by every `gyre` command.
 *
 * A command declares its flags as a `FlagSpec` (name -> kind, default, doc); `parseFlags`
 * turns argv into a typed record or fails with a `UsageError` whose message is one line
 * naming the command and the bad flag. `main.ts` prints that line and exits with 2.
 * Accepted forms: `--name value`, `--name=value`, and bare `--name` for booleans.
 *
 * `parseConfigured` (train, demo, node, serve) adds the configuration layers: a JSON file
 * (`--config FILE`, keys are flag names), the environment (`GYRE_<FLAG>`, e.g. `GYRE_STEPS`,
 * `GYRE_MAX_STALENESS`) and the flags, later ones winning: file < environment < flags. Every
 * value is checked against the Schema of its flag's kind; an error names the flag and where the
 * value came from. `parseRunFlags` takes the run as the first word (`gyre status RUN`).
 */
import * as fs from "node:fs"
import { Schema } from "effect"

export class UsageError extends Error {
  readonly _tag = "UsageError"
}

export type FlagKind = "string" | "number" | "integer" | "boolean" | "numbers"

export interface FlagDef {
  readonly kind: FlagKind
  readonly doc: string
  readonly required?: boolean
  readonly default?: string | number | boolean
  /** Allowed values for a string flag. */
  readonly choices?: ReadonlyArray<string>
}

export type FlagSpec = Readonly<Record<string, FlagDef>>

/** A `gyre` sub-command: each module under `src/cli/` exports one as `command`. */
export interface Command<S extends FlagSpec = FlagSpec> {
  readonly summary: string
  readonly flags: S
  /** Reads `--config FILE` and `GYRE_<FLAG>` too (`parseConfigured`). */
  readonly configured?: boolean
  /** Runs the command; resolves to the process exit code. */
  readonly run: (argv: ReadonlyArray<string>) => Promise<number>
}

type ValueOf<K extends FlagKind> = K extends "string"
  ? string
  : K extends "number" | "integer"
    ? number
    : K extends "boolean"
      ? boolean
      : ReadonlyArray<number>

/** The parsed flags: required or defaulted flags are present, the others may be undefined. */
export type Flags<S extends FlagSpec> = {
  readonly [N in keyof S]: S[N] extends { required: true } | { default: unknown }
    ? ValueOf<S[N]["kind"]>
    : ValueOf<S[N]["kind"]> | undefined
}

const parseValue = (who: string, name: string, def: FlagDef, raw: string): unknown => {
  const bad = (what: string) => new UsageError(`${who}: --${name} ${what}, got '${raw}'`)
  switch (def.kind) {
    case "string":
      if (def.choices && !def.choices.includes(raw)) throw bad(`must be one of ${def.choices.join("|")}`)
      return raw
    case "number": {
      const n = Number(raw)
      if (raw.trim() === "" || !Number.isFinite(n)) throw bad("must be a number")
      return n
    }
    case "integer": {
      const n = Number(raw)
      if (raw.trim() === "" || !Number.isSafeInteger(n)) throw bad("must be an integer")
      return n
    }
    case "boolean":
      if (raw === "true") return true
      if (raw === "false") return false
      throw bad("must be true or false")
    case "numbers": {
      const parts = raw.split(",").map((s) => s.trim())
      const ns = parts.map(Number)
      if (parts.some((p) => p === "") || ns.some((n) => !Number.isFinite(n))) {
        throw bad("must be a comma-separated list of numbers")
      }
      return ns
    }
  }
}

/** Parses `argv` (the words after the command name) against `spec`, over `base` (values already set). */
export const parseFlags = <S extends FlagSpec>(
  command: string,
  spec: S,
  argv: ReadonlyArray<string>,
  base: Readonly<Record<string, unknown>> = {}
): Flags<S> => parseFlagsAs(`gyre ${command}`, spec, argv, base)

/** `parseFlags` for a program other than `gyre` (a benchmark): `who` starts every error's line. */
export const parseFlagsAs = <S extends FlagSpec>(
  who: string,
  spec: S,
  argv: ReadonlyArray<string>,
  base: Readonly<Record<string, unknown>> = {}
): Flags<S> => {
  const out: Record<string, unknown> = { ...base }
  for (let i = 0; i < argv.length; i++) {
    const word = argv[i]!
    if (!word.startsWith("--")) throw new UsageError(`${who}: unexpected argument '${word}'`)
    const eq = word.indexOf("=")
    const name = eq >= 0 ? word.slice(2, eq) : word.slice(2)
    const def = spec[name]
    if (def === undefined) {
      throw new UsageError(`${who}: unknown flag --${name} (known: ${Object.keys(spec).map((k) => `--${k}`).join(" ")})`)
    }
    let raw: string
    if (eq >= 0) raw = word.slice(eq + 1)
    else if (def.kind === "boolean" && (i + 1 >= argv.length || argv[i + 1]!.startsWith("--"))) raw = "true"
    else {
      if (i + 1 >= argv.length) throw new UsageError(`${who}: --${name} needs a value`)
      raw = argv[++i]!
    }
    out[name] = parseValue(who, name, def, raw)
  }
  for (const [name, def] of Object.entries(spec)) {
    if (out[name] !== undefined) continue
    if (def.default !== undefined) out[name] = def.default
    else if (def.required) throw new UsageError(`${who}: --${name} is required`)
  }
  return out as Flags<S>
}

/** The Schema a flag's value must satisfy, whatever its source. */
const schemaOf = (def: FlagDef): Schema.Top => {
  switch (def.kind) {
    case "string":
      return def.choices === undefined ? Schema.String : Schema.Literals(def.choices as ReadonlyArray<string>)
    case "number":
      return Schema.Number.check(Schema.isFinite())
    case "integer":
      return Schema.Int
    case "boolean":
      return Schema.Boolean
    case "numbers":
      return Schema.Array(Schema.Number.check(Schema.isFinite()))
  }
}

const kindText: Record<FlagKind, string> = {
  string: "a string",
  number: "a number",
  integer: "an integer",
  boolean: "true or false",
  numbers: "a list of numbers"
}

/** The environment variable of a flag: `GYRE_` and its name in upper snake case. */
export const envName = (flag: string): string => `GYRE_${flag.toUpperCase().replace(/-/g, "_")}`

/** The values of a `--config` file, each checked against its flag's Schema. */
const configFile = (command: string, spec: FlagSpec, file: string): Record<string, unknown> => {
  let parsed: unknown
  try {
    parsed = JSON.parse(fs.readFileSync(file, "utf8"))
  } catch (e) {
    throw new UsageError(`gyre ${command}: --config ${file}: ${e instanceof Error ? e.message : String(e)}`)
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new UsageError(`gyre ${command}: --config ${file}: must hold one JSON object of flag names and values`)
  for (const [name, value] of Object.entries(parsed)) {
    const def = spec[name]
    if (def === undefined) throw new UsageError(`gyre ${command}: field '${name}' in config file ${file} is not a flag (known: ${Object.keys(spec).join(" ")})`)
    const ok = Schema.is(schemaOf(def))(value)
    if (!ok) throw new UsageError(`gyre ${command}: field '${name}' in config file ${file} must be ${def.choices ? `one of ${def.choices.join("|")}` : kindText[def.kind]}, got ${JSON.stringify(value)}`)
  }
  return parsed as Record<string, unknown>
}

/** The `GYRE_<FLAG>` values of the environment, parsed as their flags (an error names the variable). */
const fromEnv = (command: string, spec: FlagSpec, env: Readonly<Record<string, string | undefined>>): Record<string, unknown> => {
  const out: Record<string, unknown> = {}
  for (const [name, def] of Object.entries(spec)) {
    const raw = env[envName(name)]
    if (raw === undefined || raw === "") continue
    try {
      out[name] = parseValue(`gyre ${command}`, name, def, raw)
    } catch (e) {
      throw new UsageError(`${(e as Error).message} (from the environment, ${envName(name)})`)
    }
  }
  return out
}

/** `parseFlags` over the configuration file (`--config`) and the environment: file < environment < flags. */
export const parseConfigured = <S extends FlagSpec>(
  command: string,
  spec: S,
  argv: ReadonlyArray<string>,
  env: Readonly<Record<string, string | undefined>> = process.env
): Flags<S> => {
  const at = argv.findIndex((w) => w === "--config" || w.startsWith("--config="))
  let rest = argv
  let file: Record<string, unknown> = {}
  if (at >= 0) {
    const word = argv[at]!
    const path = word.includes("=") ? word.slice(word.indexOf("=") + 1) : argv[at + 1]
    if (path === undefined || path === "") throw new UsageError(`gyre ${command}: --config needs a file`)
    file = configFile(command, spec, path)
    rest = [...argv.slice(0, at), ...argv.slice(at + (word.includes("=") ? 1 : 2))]
  }
  return parseFlags(command, spec, rest, { ...file, ...fromEnv(command, spec, env) })
}

/** The run as the first word (`gyre status RUN`), else `--run`; the flags parsed after it. */
export const parseRunFlags = <S extends FlagSpec>(command: string, spec: S, argv: ReadonlyArray<string>): { readonly run: string; readonly f: Flags<S> } => {
  const named = argv[0] !== undefined && !argv[0].startsWith("--") ? argv[0] : undefined
  const f = parseFlags(command, spec, named === undefined ? argv : argv.slice(1))
  const run = named ?? (f as Record<string, unknown>).run
  if (typeof run !== "string") throw new UsageError(`gyre ${command}: name the run (gyre ${command} RUN)`)
  return { run, f }
}

/** One line per flag, for `gyre <command> --help` (with the configuration layers where the command reads them). */
export const usage = (command: string, summary: string, spec: FlagSpec, configured = false): string => usageAs(`gyre ${command}`, summary, spec, configured)

/** `usage` for a program other than `gyre` (a benchmark), named by `who`. */
export const usageAs = (who: string, summary: string, spec: FlagSpec, configured = false): string =>
  [
    `${who}: ${summary}`,
    ...Object.entries(spec).map(([name, def]) => {
      const extra = def.required ? " (required)" : def.default !== undefined ? ` (default ${def.default})` : ""
      return `  --${name.padEnd(18)} ${def.doc}${extra}${configured ? ` [${envName(name)}]` : ""}`
    }),
    ...(configured ? [`  --${"config".padEnd(18)} a JSON file of flag values; the environment ([GYRE_...]) overrides it, flags override both`] : [])
  ].join("\n")
