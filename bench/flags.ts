/**
 * A benchmark's flags, declared and parsed as the `gyre` commands' are (`src/cli/args.ts`):
 * `--name value` or `--name=value`; an unknown flag, a value of the wrong kind or one a
 * benchmark refuses (`refuse`) is one line on stderr naming the benchmark and the flag, and
 * exit 2 before anything runs; `--help` lists the flags with their defaults.
 */
import { parseFlagsAs, usageAs, UsageError, type FlagSpec, type Flags } from "../src/cli/args.ts"

const usageExit = (line: string): never => {
  console.error(line)
  process.exit(2)
}

/** One line on stderr, exit 2: a flag value the benchmark cannot run with. */
export const refuse = (bench: string, line: string): never => usageExit(`${bench}: ${line}`)

/** The flags of `npm run <bench> -- ...`, parsed from this process's arguments. */
export const benchFlags = <S extends FlagSpec>(bench: string, summary: string, spec: S, argv: ReadonlyArray<string> = process.argv.slice(2)): Flags<S> => {
  if (argv.includes("--help")) {
    console.log(usageAs(`npm run ${bench} --`, summary, spec))
    process.exit(0)
  }
  try {
    return parseFlagsAs(bench, spec, argv)
  } catch (e) {
    if (e instanceof UsageError) return usageExit(e.message)
    throw e
  }
}

/** A comma-separated flag's items, each one of `known`; otherwise `refuse`. */
export const listOf = <T extends string>(bench: string, flag: string, value: string, known: ReadonlyArray<T>): Array<T> => {
  const items = value.split(",").filter((x) => x !== "")
  const unknown = items.filter((x) => !(known as ReadonlyArray<string>).includes(x))
  if (items.length === 0 || unknown.length > 0) refuse(bench, `--${flag} takes a comma-separated list of ${known.join(", ")}, got '${value}'`)
  return items as Array<T>
}

/** Refuses an integer flag below `min`. */
export const atLeast = (bench: string, flag: string, value: number, min: number): number =>
  value >= min ? value : refuse(bench, `--${flag} must be at least ${min}, got ${value}`)
