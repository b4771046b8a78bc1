/**
 * ARCHITECTURE.md's table of a run's channels is the one the run's topology derives
 * (`channelTable`): a kind, channel or event added to the topology and not to the document
 * (or the reverse) fails here.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { RunTopology, channelTable } from "../../src/protocols/topology.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"

const documented = () => {
  const doc = fs.readFileSync(path.join(repoRoot, "ARCHITECTURE.md"), "utf8")
  const m = /<!-- topology:channels -->\n([\s\S]*?)\n<!-- \/topology:channels -->/.exec(doc)
  if (m === null) throw new Error("ARCHITECTURE.md has no <!-- topology:channels --> table")
  return m[1]!
}

describe("the channel table", () => {
  it("in ARCHITECTURE.md is the topology's", () => {
    expect(documented()).toBe(channelTable(RunTopology))
  })

  it("has a row for every kind, channel and event of the topology", () => {
    const rows = channelTable(RunTopology).split("\n").slice(2)
    expect(rows.length).toBe(Object.keys(RunTopology.kinds).length + RunTopology.channels.length + RunTopology.events.length)
    for (const kind of Object.keys(RunTopology.kinds)) expect(rows.some((r) => r.includes(`.${kind}.<id>\``))).toBe(true)
    for (const e of RunTopology.events) expect(rows.some((r) => r.startsWith(`| \`gyre.R.sys.${e.name}\``))).toBe(true)
  })
})
