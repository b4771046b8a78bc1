/**
 * `gyre engine`: the native engine from the command line, for debugging numerics.
 *
 *   gyre engine init --preset P --seed S --out DIR
 *   gyre engine score --checkpoint DIR --tokens 1,2,3,...
 *       prints {"token_logprobs": [...], "last_logprobs": [...]}: the log-prob of each next
 *       input token (n - 1 values), and the full log-softmax after the last token
 *   gyre engine sft-step --checkpoint DIR --tokens ... --lr X --out DIR2
 *       one AdamW step of mean cross-entropy over the tokens (torch.optim.AdamW defaults:
 *       betas 0.9 / 0.999, eps 1e-8, weight decay 0.01; gradient clipped to norm 1.0),
 *       continuing the checkpoint's optimizer state when it has one
 *   gyre engine generate --checkpoint DIR --prompt TEXT
 *       samples the assistant's reply to a one-message chat (the checkpoint's own tokenizer
 *       and chat template when it has a tokenizer.json, else Gyre's byte-level ones)
 *   gyre engine convert --checkpoint DIR --out DIR2 [--dtype BF16] [--max-shard-size 5GB]
 *       rewrites a checkpoint (e.g. a Hugging Face one) with another dtype or shard size
 *
 * Checkpoints are Gyre's or Hugging Face Llama directories (`src/engine/checkpoint.ts`); what
 * a command writes keeps the dtype it read (F32 for init) unless --dtype says otherwise, in
 * shards of at most --max-shard-size.
 *
 * The backend (GYRE_BACKEND or automatic) is logged on stderr; results go to stdout.
 */
import { Effect, Layer, Logger, type Scope } from "effect"
import { loadCheckpoint, restoreOptimizer, saveCheckpoint } from "../engine/checkpoint.ts"
import { Engine } from "../engine/engine.ts"
import { type PresetName, presetNames, presets } from "../engine/presets.ts"
import { dtypes, type Dtype } from "../engine/safetensors.ts"
import { chatFormatOf } from "../openai/hf-chat.ts"
import { adamwDefaults } from "../engine/trainer.ts"
import { type FlagSpec, UsageError, parseFlags, type Command } from "./args.ts"
import { checkCheckpoint } from "./checks.ts"

/** Flags of the commands that write a checkpoint. */
const saveFlags = {
  dtype: { kind: "string", doc: "stored dtype of the output (default: the input's; init: F32)", choices: Object.keys(dtypes) },
  "max-shard-size": { kind: "string", doc: "largest weight file before the next shard, e.g. 5GB, 500MB, 2000000 bytes", default: "5GB" }
} as const satisfies FlagSpec

const units: Record<string, number> = { "": 1, B: 1, KB: 1e3, MB: 1e6, GB: 1e9, KIB: 1024, MIB: 1024 ** 2, GIB: 1024 ** 3 }

/** HF's max_shard_size: a byte count, or a number with KB/MB/GB (powers of 1000) or KiB/MiB/GiB. */
export const parseShardSize = (text: string): number => {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text)
  const unit = m === null ? undefined : units[m[2]!.toUpperCase()]
  if (m === null || unit === undefined || !(Number(m[1]) * unit >= 1)) {
    throw new UsageError(`gyre engine: --max-shard-size must be a size like 5GB, 500MB or 2000000, got '${text}'`)
  }
  return Math.floor(Number(m[1]) * unit)
}

const saveOptionsOf = (f: { readonly dtype?: string | undefined; readonly "max-shard-size": string }) => ({
  ...(f.dtype === undefined ? {} : { dtype: f.dtype as Dtype }),
  maxShardBytes: parseShardSize(f["max-shard-size"])
})

const subcommands = {
  init: {
    summary: "create a randomly initialised checkpoint",
    flags: {
      preset: { kind: "string", doc: "model preset", choices: presetNames, default: "tiny" },
      seed: { kind: "integer", doc: "initialisation seed", default: 0 },
      out: { kind: "string", doc: "checkpoint directory to write", required: true },
      ...saveFlags
    }
  },
  score: {
    summary: "log-probs of a token sequence as JSON",
    flags: {
      checkpoint: { kind: "string", doc: "checkpoint directory", required: true },
      tokens: { kind: "numbers", doc: "comma-separated token ids", required: true }
    }
  },
  "sft-step": {
    summary: "one AdamW step of cross-entropy on a token sequence",
    flags: {
      checkpoint: { kind: "string", doc: "checkpoint directory", required: true },
      tokens: { kind: "numbers", doc: "comma-separated token ids (at least 2)", required: true },
      lr: { kind: "number", doc: "learning rate", required: true },
      out: { kind: "string", doc: "checkpoint directory to write", required: true },
      beta1: { kind: "number", doc: "AdamW beta1", default: adamwDefaults.beta1 },
      beta2: { kind: "number", doc: "AdamW beta2", default: adamwDefaults.beta2 },
      eps: { kind: "number", doc: "AdamW eps", default: adamwDefaults.eps },
      "weight-decay": { kind: "number", doc: "AdamW decoupled weight decay", default: adamwDefaults.weightDecay },
      "max-grad-norm": { kind: "number", doc: "global gradient-norm clip (0: none)", default: adamwDefaults.maxGradNorm },
      ...saveFlags
    }
  },
  generate: {
    summary: "sample a reply to a prompt",
    flags: {
      checkpoint: { kind: "string", doc: "checkpoint directory", required: true },
      prompt: { kind: "string", doc: "the user message", required: true },
      "max-tokens": { kind: "integer", doc: "most tokens to generate", default: 128 },
      temperature: { kind: "number", doc: "sampling temperature (0: greedy)", default: 1 },
      "top-p": { kind: "number", doc: "nucleus sampling mass", default: 1 },
      seed: { kind: "integer", doc: "sampling seed", default: 0 }
    }
  },
  convert: {
    summary: "rewrite a checkpoint with another dtype or shard size",
    flags: {
      checkpoint: { kind: "string", doc: "checkpoint directory", required: true },
      out: { kind: "string", doc: "checkpoint directory to write", required: true },
      ...saveFlags
    }
  }
} as const satisfies Record<string, { summary: string; flags: FlagSpec }>

type Subcommand = keyof typeof subcommands

/** Engine with the backend line on stderr (stdout carries the results). */
const engineLayer = Engine.layer.pipe(
  Layer.provide(Logger.layer([Logger.make(({ message }) => console.error(Array.isArray(message) ? message.join(" ") : String(message)))]))
)

const run = <A, E extends { readonly message: string }>(effect: Effect.Effect<A, E, Engine | Scope.Scope>): Promise<A> =>
  Effect.runPromise(
    effect.pipe(
      Effect.scoped,
      Effect.provide(engineLayer),
      Effect.mapError((e) => new Error(e.message))
    )
  )

const checkTokens = (name: string, tokens: ReadonlyArray<number>, min: number) => {
  if (tokens.length < min) throw new UsageError(`gyre engine ${name}: --tokens needs at least ${min} ids`)
  if (tokens.some((t) => !Number.isInteger(t) || t < 0)) throw new UsageError(`gyre engine ${name}: --tokens must be non-negative integers`)
}

const logSoftmax = (row: Float32Array): Array<number> => {
  let max = -Infinity
  for (const x of row) max = Math.max(max, x)
  let sum = 0
  for (const x of row) sum += Math.exp(x - max)
  const lse = max + Math.log(sum)
  return Array.from(row, (x) => x - lse)
}

const handlers: Record<Subcommand, (argv: ReadonlyArray<string>) => Promise<void>> = {
  init: async (argv) => {
    const f = parseFlags("engine init", subcommands.init.flags, argv)
    const config = presets[f.preset as PresetName]
    const params = await run(
      Effect.gen(function* () {
        const model = yield* (yield* Engine).createModel(config, { seed: f.seed })
        yield* saveCheckpoint(f.out, model, undefined, saveOptionsOf(f))
        return model.paramCount
      })
    )
    console.log(JSON.stringify({ out: f.out, preset: f.preset, seed: f.seed, params }))
  },
  score: async (argv) => {
    const f = parseFlags("engine score", subcommands.score.flags, argv)
    checkCheckpoint("engine score", f.checkpoint)
    checkTokens("score", f.tokens, 1)
    const result = await run(
      Effect.gen(function* () {
        const { model } = yield* loadCheckpoint(f.checkpoint)
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: Math.ceil(f.tokens.length / 16) })
        const seq = yield* cache.create()
        const logits = (yield* cache.forward([{ seq, tokens: f.tokens }], "all")).logits!
        const V = model.config.vocab_size
        const rows = f.tokens.map((_, t) => logSoftmax(logits.subarray(t * V, (t + 1) * V)))
        return { token_logprobs: f.tokens.slice(1).map((tok, i) => rows[i]![tok]!), last_logprobs: rows.at(-1)! }
      })
    )
    console.log(JSON.stringify(result))
  },
  "sft-step": async (argv) => {
    const f = parseFlags("engine sft-step", subcommands["sft-step"].flags, argv)
    checkCheckpoint("engine sft-step", f.checkpoint)
    checkTokens("sft-step", f.tokens, 2)
    const result = await run(
      Effect.gen(function* () {
        const { model, optimizer } = yield* loadCheckpoint(f.checkpoint)
        const trainer = yield* model.trainer({ maxTokens: f.tokens.length })
        if (optimizer !== undefined) yield* restoreOptimizer(f.checkpoint, trainer, optimizer)
        const n = f.tokens.length
        const batch = {
          length: n,
          tokens: Int32Array.from(f.tokens),
          parents: Int32Array.from(f.tokens, (_, i) => i - 1),
          positions: Int32Array.from(f.tokens, (_, i) => i),
          weights: Float32Array.from(f.tokens, (_, i) => (i === 0 ? 0 : 1 / (n - 1))),
          advantages: new Float32Array(n),
          behaviourLogprobs: new Float32Array(n),
          proximalLogprobs: new Float32Array(n).fill(Number.NaN),
          versions: new Int32Array(n)
        }
        const { stats } = yield* trainer.train(batch, { kind: "sft" })
        const gradNorm = yield* trainer.step({
          lr: f.lr,
          beta1: f.beta1,
          beta2: f.beta2,
          eps: f.eps,
          weightDecay: f["weight-decay"],
          maxGradNorm: f["max-grad-norm"]
        })
        yield* saveCheckpoint(f.out, model, trainer, saveOptionsOf(f))
        return { out: f.out, loss: stats.loss, grad_norm: gradNorm, step: yield* trainer.stepCount() }
      })
    )
    console.log(JSON.stringify(result))
  },
  generate: async (argv) => {
    const f = parseFlags("engine generate", subcommands.generate.flags, argv)
    checkCheckpoint("engine generate", f.checkpoint)
    const chat = await chatFormatOf(f.checkpoint)
    const text = await run(
      Effect.gen(function* () {
        const { model } = yield* loadCheckpoint(f.checkpoint)
        const prompt = Array.from(chat.render([{ role: "user", content: f.prompt }], [], undefined))
        const limit = Math.min(f["max-tokens"], model.config.max_position_embeddings - prompt.length)
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: Math.ceil((prompt.length + limit + 1) / 16) })
        const seq = yield* cache.create()
        const sampling = { temperature: f.temperature, topP: f["top-p"], seed: f.seed }
        const out: Array<number> = []
        let next = prompt as ReadonlyArray<number>
        while (out.length < limit) {
          const r = yield* cache.forward([{ seq, tokens: next, sampling }], "none")
          const token = r.sampled![0]!
          if (chat.stopIds.includes(token)) break
          out.push(token)
          next = [token]
        }
        return chat.tokenizer.decode(out)
      })
    )
    console.log(text)
  },
  convert: async (argv) => {
    const f = parseFlags("engine convert", subcommands.convert.flags, argv)
    checkCheckpoint("engine convert", f.checkpoint)
    const options = saveOptionsOf(f)
    const result = await run(
      Effect.gen(function* () {
        const { model } = yield* loadCheckpoint(f.checkpoint)
        yield* saveCheckpoint(f.out, model, undefined, options)
        return { out: f.out, dtype: options.dtype ?? model.origin?.dtype, params: model.paramCount }
      })
    )
    console.log(JSON.stringify(result))
  }
}

export const command: Command = {
  summary: "native engine: init | score | sft-step | generate | convert (checkpoints, numerics)",
  flags: {
    ...(Object.assign({}, ...Object.values(subcommands).map((s) => s.flags)) as FlagSpec),
    seed: { kind: "integer", doc: "init: initialisation seed; generate: sampling seed", default: 0 }
  },
  run: async (argv) => {
    const [name, ...rest] = argv
    if (name === undefined || !(name in subcommands)) {
      throw new UsageError(`gyre engine: expected ${Object.keys(subcommands).join(" | ")}, got '${name ?? ""}' (gyre engine --help lists the flags)`)
    }
    await handlers[name as Subcommand](rest)
    return 0
  }
}
