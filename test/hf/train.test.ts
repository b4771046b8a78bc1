/**
 * `gyre train --checkpoint DIR` on a Hugging Face model directory as the hub ships it (BF16 in
 * two shards with an index, a byte-level BPE tokenizer.json, SmolLM2's chat template,
 * generation_config.json): harnesses talk to it through the model's own template and tokenizer,
 * sending its earlier answers back; the trainer rebuilds every execution's tree from the call
 * records and trains on them (token-exact: `gyre replay --trees` checks the trees against the
 * trainer's record), and the run's checkpoints are complete HF directories again, in the input's
 * dtype. The random model cannot play the toy suite (every execution would score 0 and train
 * nothing), so the suite here scores a reply by its share of ASCII letters.
 */
import { execFileSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { headerLength, parseHeader } from "../../src/engine/safetensors.ts"
import { writeSmolModel } from "./fixtures.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const run = (...args: Array<string>) => execFileSync("node", [gyre, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 240_000 })
const jsonLines = (out: string) => out.trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, any>)

/** Two chat calls, the first answer sent back with the second; the score is the answers' share of ASCII letters. */
const harness = `
import { writeFileSync } from "node:fs"
const messages = [{ role: "system", content: "Answer with words." }, { role: "user", content: "Hello there" }]
let letters = 0, total = 0
for (const next of ["Once more", undefined]) {
  const r = await fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
    method: "POST",
    headers: { authorization: "Bearer " + process.env.OPENAI_API_KEY, "content-type": "application/json" },
    body: JSON.stringify({ model: "gyre", messages, max_tokens: 12 })
  })
  if (!r.ok) throw new Error(r.status + " " + (await r.text()))
  const text = (await r.json()).choices[0].message.content ?? ""
  total += text.length
  letters += (text.match(/[A-Za-z]/g) ?? []).length
  if (next !== undefined) messages.push({ role: "assistant", content: text }, { role: "user", content: next })
}
writeFileSync("artifact.txt", String(total === 0 ? 0 : letters / total))
`

/** A suite folder `letters` under `root` (ARCHITECTURE.md, "Harness runner and task suites"). */
const writeLettersSuite = (root: string) => {
  const dir = join(root, "letters")
  mkdirSync(join(dir, "template"), { recursive: true })
  writeFileSync(join(dir, "template", ".keep"), "")
  writeFileSync(join(dir, "harness.mjs"), harness)
  writeFileSync(join(dir, "score.mjs"), `import { readFileSync } from "node:fs"\nconsole.log(JSON.stringify({ score: Number(readFileSync("artifact.txt", "utf8")) }))\n`)
  writeFileSync(
    join(dir, "suite.json"),
    JSON.stringify({
      description: "a reply's share of ASCII letters",
      harness: { command: ["node", "{suite}/harness.mjs"], timeoutMs: 60_000 },
      scorer: { command: ["node", "{suite}/score.mjs"], timeoutMs: 10_000 },
      template: "template",
      tasks: [
        { id: "train-{n}", split: "train", count: 8 },
        { id: "heldout-{n}", split: "heldout", count: 1 }
      ]
    })
  )
  return root
}

/** The dtypes of a safetensors file's tensors, read with the engine's header parser. */
const dtypesOf = (file: string) => {
  const bytes = readFileSync(file)
  const length = headerLength(bytes)
  return new Set(parseHeader(bytes.subarray(8, 8 + length), bytes.length).map((t) => t.dtype))
}

describe("gyre train on a Hugging Face directory", () => {
  it("trains a step through the model's own template and tokenizer, token-exact, and saves an HF directory in its dtype", async () => {
    const root = mkdtempSync(join(tmpdir(), "gyre-hf-train-"))
    const model = await writeSmolModel(join(root, "smol"))
    const store = join(root, "store")
    const suites = writeLettersSuite(join(root, "suites"))
    const shape = ["--steps", "1", "--devices", "1", "--executions-per-step", "4", "--group-size", "4", "--slots", "4", "--lr", "1e-3"]
    const summary = jsonLines(run("train", "--run", "hf", "--suites", suites, "--suite", "letters", "--checkpoint", model, ...shape, "--heldout", "heldout-0", "--store", store, "--json")).at(-1)!
    expect(summary).toMatchObject({ steps: 1, executions_lost: 0, trained_twice: 0, stale_dropped: 0 })

    // The step trained generated tokens of both executions, whose trees the trainer rebuilt.
    const [step] = jsonLines(run("replay", "hf", "--store", store, "--type", "step", "--json")).map((e) => e.payload)
    expect(step).toMatchObject({ step: 0, executions: 4, dropped: 0 })
    expect(step.tokensTrained).toBeGreaterThan(0)
    expect(step.microBatches).toBeGreaterThan(0)
    expect(step.trees).toHaveLength(4)
    expect(step.trees.every((t: { calls: number }) => t.calls === 2)).toBe(true)
    // Every tree rebuilt from the recorded calls equals the trainer's (exit 0, else it names the execution).
    run("replay", "hf", "--store", store, "--trees")

    // The prompts went through the model's template: every recorded call starts with its system
    // turn's <|im_start|>, and the export decodes each call to the model's token ids.
    const tokenizer = JSON.parse(readFileSync(join(model, "tokenizer.json"), "utf8")) as { added_tokens: Array<{ id: number; content: string }> }
    const imStart = tokenizer.added_tokens.find((t) => t.content === "<|im_start|>")!.id
    run("replay", "hf", "--store", store, "--export", join(root, "export"))
    const calls = jsonLines(readFileSync(join(root, "export", "calls.jsonl"), "utf8"))
    expect(calls.length).toBe(8)
    for (const c of calls) expect(c.prompt[0]).toBe(imStart)
    // Token-exact: the answer sent back is the generated ids, so each second call's prompt starts
    // with the first call's prompt and output as they were (less the end-of-turn token that
    // stopped it: the template closes the turn with its own), whatever re-encoding the text gives.
    for (const execution of new Set(calls.map((c) => c.execution))) {
      const [first, second] = calls.filter((c) => c.execution === execution).sort((a, b) => a.startedAt - b.startedAt)
      const output = first!.finishReason === "stop" ? first!.output.slice(0, -1) : first!.output
      const sent = [...first!.prompt, ...output]
      expect(second!.prompt.slice(0, sent.length)).toEqual(sent)
    }

    // The final checkpoint is a complete HF directory in the input's dtype.
    const out = summary.checkpoint as string
    const files = readdirSync(out)
    expect(files).toEqual(expect.arrayContaining(["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]))
    const weights = files.filter((f) => f.endsWith(".safetensors") && f !== "optimizer.safetensors")
    expect(weights.length).toBeGreaterThan(0)
    for (const f of weights) expect(dtypesOf(join(out, f))).toEqual(new Set(["BF16"]))
    expect(JSON.parse(readFileSync(join(out, "config.json"), "utf8")).torch_dtype).toBe("bfloat16")
    expect(existsSync(join(out, "optimizer.safetensors"))).toBe(true)
  }, 300_000)
})
