/**
 * Flag parsing shared by every `gyre` command.
 *
 * A command declares its flags as a `FlagSpec` (name -> kind, default, doc); `parseFlags`
 * turns argv into a typed record or fails with a `UsageError` whose message is one line
 * naming the command and the bad flag. `main.ts` prints that line and exits with 2.
 * Accepted forms: `--name value`, `--name=value`, and bare `--name` for booleans.
 */

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

const parseValue = (command: string, name: string, def: FlagDef, raw: string): unknown => {
  const bad = (what: string) => new UsageError(`gyre ${command}: --${name} ${what}, got '${raw}'`)
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

/** Parses `argv` (the words after the command name) against `spec`. */
export const parseFlags = <S extends FlagSpec>(
  command: string,
  spec: S,
  argv: ReadonlyArray<string>
): Flags<S> => {
  const out: Record<string, unknown> = {}
  for (let i = 0; i < argv.length; i++) {
    const word = argv[i]!
    if (!word.startsWith("--")) throw new UsageError(`gyre ${command}: unexpected argument '${word}'`)
    const eq = word.indexOf("=")
    const name = eq >= 0 ? word.slice(2, eq) : word.slice(2)
    const def = spec[name]
    if (def === undefined) {
      throw new UsageError(`gyre ${command}: unknown flag --${name} (known: ${Object.keys(spec).map((k) => `--${k}`).join(" ")})`)
    }
    let raw: string
    if (eq >= 0) raw = word.slice(eq + 1)
    else if (def.kind === "boolean" && (i + 1 >= argv.length || argv[i + 1]!.startsWith("--"))) raw = "true"
    else {
      if (i + 1 >= argv.length) throw new UsageError(`gyre ${command}: --${name} needs a value`)
      raw = argv[++i]!
    }
    out[name] = parseValue(command, name, def, raw)
  }
  for (const [name, def] of Object.entries(spec)) {
    if (out[name] !== undefined) continue
    if (def.default !== undefined) out[name] = def.default
    else if (def.required) throw new UsageError(`gyre ${command}: --${name} is required`)
  }
  return out as Flags<S>
}

/** One line per flag, for `gyre <command> --help`. */
export const usage = (command: string, summary: string, spec: FlagSpec): string =>
  [
    `gyre ${command}: ${summary}`,
    ...Object.entries(spec).map(([name, def]) => {
      const extra = def.required ? " (required)" : def.default !== undefined ? ` (default ${def.default})` : ""
      return `  --${name.padEnd(18)} ${def.doc}${extra}`
    })
  ].join("\n")
