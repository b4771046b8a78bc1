/**
 * `--kv-blocks` and `--kv-dtype` on every command that hosts devices (`train`, `demo`, `node`,
 * `serve`): a bad value is a usage error naming the command and the flag before anything
 * starts (`main.ts` prints it as one line, exit code 2: test/cli/smoke.test.ts); `train` writes both into the run's
 * configuration, which `gyre node --run R` devices read from the journal.
 */
import { describe, expect, it } from "vitest"
import { UsageError, parseConfigured, type Command } from "../../src/cli/args.ts"
import { runConfigOf, trainFlags } from "../../src/cli/train.ts"

/** The UsageError a command's run fails with (`main.ts` prints its one line and exits 2). */
const refusal = async (name: string, argv: ReadonlyArray<string>): Promise<string> => {
  const { command } = (await import(`../../src/cli/${name}.ts`)) as { command: Command }
  const error = await command.run(argv).then(
    () => undefined,
    (e: unknown) => e
  )
  expect(error, `${name} ${argv.join(" ")}`).toBeInstanceOf(UsageError)
  return (error as Error).message
}

describe("KV pool flags", () => {
  it("refuses a bad --kv-blocks or --kv-dtype on train, demo, node and serve with one line before starting anything", async () => {
    expect(await refusal("train", ["--kv-blocks", "0"])).toBe("gyre train: --kv-blocks must be between 1 and 67108864 (blocks of 16 tokens), got 0")
    expect(await refusal("demo", ["--kv-dtype", "f8"])).toBe("gyre demo: --kv-dtype must be one of f32|f16, got 'f8'")
    expect(await refusal("node", ["--kv-blocks", "-3"])).toBe("gyre node: --kv-blocks must be between 1 and 67108864 (blocks of 16 tokens), got -3")
    expect(await refusal("node", ["--kv-dtype", "bf16"])).toBe("gyre node: --kv-dtype must be one of f32|f16, got 'bf16'")
    expect(await refusal("serve", ["--checkpoint", "/nonexistent", "--kv-blocks", "99999999999"])).toMatch(/^gyre serve: --kv-blocks must be between 1 and 67108864 .*got 99999999999$/)
  })

  it("carries --kv-blocks and --kv-dtype in the run's configuration", () => {
    const f = parseConfigured("train", trainFlags, ["--kv-blocks", "65536", "--kv-dtype", "f16"], {})
    const config = runConfigOf(f, "r", "/ckpt", "/ckpt/out")
    expect([config.kvBlocks, config.kvDtype]).toEqual([65536, "f16"])
    const defaults = runConfigOf(parseConfigured("train", trainFlags, [], {}), "r", "/ckpt", "/ckpt/out")
    expect([defaults.kvBlocks, defaults.kvDtype]).toEqual([4096, "f32"])
  })
})
