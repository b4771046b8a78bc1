/**
 * The configuration layers of `train`, `demo`, `node` and `serve` (`parseConfigured`): a JSON file
 * (`--config`), then the environment (`GYRE_<FLAG>`), then flags, later ones winning; every value
 * checked against its flag's Schema; errors name the flag and the source.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { UsageError, parseConfigured, parseRunFlags } from "../../src/cli/args.ts"

const spec = {
  steps: { kind: "integer", doc: "", default: 8 },
  policy: { kind: "string", doc: "", default: "elastic", choices: ["elastic", "colocate"] },
  lr: { kind: "number", doc: "" },
  json: { kind: "boolean", doc: "", default: false },
  "max-staleness": { kind: "integer", doc: "", default: 1 }
} as const

const file = (value: unknown) => {
  const p = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "gyre-cfg-")), "c.json")
  fs.writeFileSync(p, typeof value === "string" ? value : JSON.stringify(value))
  return p
}

const failure = (f: () => unknown): string => {
  try {
    f()
  } catch (e) {
    expect(e).toBeInstanceOf(UsageError)
    return (e as Error).message
  }
  throw new Error("expected a UsageError")
}

describe("configuration layers", () => {
  it("takes defaults, then the file, then the environment, then flags", () => {
    const c = file({ steps: 3, policy: "colocate", lr: 0.1, "max-staleness": 0 })
    expect(parseConfigured("t", spec, [], {})).toEqual({ steps: 8, policy: "elastic", json: false, "max-staleness": 1 })
    expect(parseConfigured("t", spec, ["--config", c], {})).toEqual({ steps: 3, policy: "colocate", lr: 0.1, json: false, "max-staleness": 0 })
    expect(parseConfigured("t", spec, [`--config=${c}`], { GYRE_STEPS: "5", GYRE_MAX_STALENESS: "2", GYRE_JSON: "true" })).toMatchObject({ steps: 5, "max-staleness": 2, json: true, lr: 0.1 })
    expect(parseConfigured("t", spec, ["--config", c, "--steps", "7"], { GYRE_STEPS: "5" })).toMatchObject({ steps: 7, policy: "colocate" })
  })

  it("names the field and its source when a value is wrong", () => {
    expect(failure(() => parseConfigured("t", spec, ["--config", file({ steps: 2.5 })], {}))).toMatch(/^gyre t: field 'steps' in config file .* must be an integer, got 2.5$/)
    expect(failure(() => parseConfigured("t", spec, ["--config", file({ policy: "fastest" })], {}))).toMatch(/field 'policy' .* must be one of elastic\|colocate, got "fastest"/)
    expect(failure(() => parseConfigured("t", spec, ["--config", file({ speed: 1 })], {}))).toMatch(/field 'speed' in config file .* is not a flag/)
    expect(failure(() => parseConfigured("t", spec, ["--config", file("[1, 2]")], {}))).toMatch(/must hold one JSON object/)
    expect(failure(() => parseConfigured("t", spec, ["--config", file("{ steps: ")], {}))).toMatch(/^gyre t: --config .*c\.json: /)
    expect(failure(() => parseConfigured("t", spec, ["--config", "/nonexistent/c.json"], {}))).toMatch(/--config \/nonexistent\/c\.json/)
    expect(failure(() => parseConfigured("t", spec, [], { GYRE_LR: "fast" }))).toBe("gyre t: --lr must be a number, got 'fast' (from the environment, GYRE_LR)")
    expect(failure(() => parseConfigured("t", spec, ["--steps", "x"], {}))).toBe("gyre t: --steps must be an integer, got 'x'")
    expect(failure(() => parseConfigured("t", spec, ["--config"], {}))).toBe("gyre t: --config needs a file")
  })

  it("takes the run as the first word or --run", () => {
    const runSpec = { run: { kind: "string", doc: "" }, json: { kind: "boolean", doc: "", default: false } } as const
    expect(parseRunFlags("status", runSpec, ["r1", "--json"])).toEqual({ run: "r1", f: { json: true } })
    expect(parseRunFlags("status", runSpec, ["--run", "r2"]).run).toBe("r2")
    expect(failure(() => parseRunFlags("status", runSpec, ["--json"]))).toBe("gyre status: name the run (gyre status RUN)")
  })
})
