/**
 * A training run's checkpoints across machines. The run's configuration names its checkpoints
 * by path (the initial weights, the directory the core writes to), and those paths are on the
 * machine that started the run; a device on another machine finds neither.
 *
 * - `publishInitialCheckpoint`: `gyre train` puts the initial checkpoint's files (config, weight
 *   shards, tokenizer files; not an optimizer state) in the run's weights bucket as
 *   `initial/<file>`, then the manifest `initial/files` (so a manifest means every file is there).
 * - `onThisMachine`: `gyre node --devices K` keeps the journaled configuration when its initial
 *   checkpoint is on this machine; otherwise it fetches the published copy into
 *   `.gyre/joined/<run>/initial` and writes the checkpoints its devices make as the core under
 *   `.gyre/joined/<run>/checkpoints`.
 * - `finalCheckpoint`: the run's last checkpoint where `gyre train` can read it: its own when its
 *   core wrote it here, else the last version's published weights (`v<steps>`) with the initial
 *   checkpoint's config and tokenizer files, written to `<checkpointDir>/step-<steps>` (no
 *   optimizer state or run state: a view of the weights, not a point to resume from).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Objm } from "@nats-io/obj"
import { Effect, Schema } from "effect"
import { CONFIG_FILE, INDEX_FILE, MODEL_FILE, TOKENIZER_FILES } from "../engine/checkpoint.ts"
import { rlLayout } from "../protocols/layout.ts"
import type { RunConfig } from "../protocols/run.ts"
import { fetchWeights } from "../protocols/weights.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { getObject, putObject, type NatsShape } from "../runtime/nats.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { checkpointPath, latestCheckpoint } from "../training/checkpoints.ts"

const MANIFEST = "initial/files"
const objectName = (file: string) => `initial/${file}`
const Manifest = Schema.fromJsonString(Schema.Struct({ files: Schema.Array(Schema.String) }))

/** The files of a checkpoint directory that make the model: config, weights (one file or shards and their index), tokenizer. */
const modelFiles = (dir: string) =>
  fs.readdirSync(dir).filter((f) => f === CONFIG_FILE || f === MODEL_FILE || f === INDEX_FILE || /^model-\d{5}-of-\d{5}\.safetensors$/.test(f) || (TOKENIZER_FILES as ReadonlyArray<string>).includes(f))

const transport = (operation: string) => (e: unknown) => new TransportError({ operation, message: messageOf(e) })

/** Puts checkpoint `dir`'s model files in run `run`'s weights bucket (see the module doc). */
export const publishInitialCheckpoint = (nats: NatsShape, run: string, dir: string) => {
  const bucket = rlLayout(run).weightsBucket
  return Effect.tryPromise({
    try: async () => {
      const store = await new Objm(nats.nc).create(bucket, { replicas: nats.replicas })
      const files = modelFiles(dir)
      for (const f of files) await putObject(store, objectName(f), fs.readFileSync(path.join(dir, f)))
      await putObject(store, MANIFEST, new TextEncoder().encode(JSON.stringify({ files })))
    },
    catch: transport(`publish the initial checkpoint ${dir} to ${bucket}`)
  })
}

/** Writes the published initial checkpoint of the system's run into `to`. */
const fetchInitialCheckpoint = (system: ActorSystemShape, to: string, journaled: string) => {
  const bucket = rlLayout(system.run).weightsBucket
  return Effect.tryPromise({
    try: async () => {
      const store = await new Objm(system.nats.nc).open(bucket)
      const read = (name: string) => getObject(system.nats.jsm, store, bucket, name)
      const manifest = await read(MANIFEST)
      if (manifest === null) throw new Error(`the run's checkpoint ${journaled} is not on this machine and the run published no copy (start it with gyre train --listen, or copy the checkpoint to that path)`)
      const { files } = Schema.decodeUnknownSync(Manifest)(new TextDecoder().decode(manifest))
      fs.mkdirSync(to, { recursive: true })
      for (const f of files) {
        const bytes = await read(objectName(f))
        if (bytes === null) throw new Error(`the run's copy of ${journaled} lacks ${f}`)
        fs.writeFileSync(path.join(to, f), bytes)
      }
    },
    catch: transport(`fetch the run's initial checkpoint from ${bucket}`)
  })
}

/** The run's configuration with checkpoint paths of this machine (see the module doc). */
export const onThisMachine = (system: ActorSystemShape, config: RunConfig) =>
  Effect.gen(function* () {
    if (fs.existsSync(path.join(config.checkpoint, CONFIG_FILE))) return config
    const here = path.resolve(".gyre", "joined", system.run)
    const initial = path.join(here, "initial")
    yield* fetchInitialCheckpoint(system, initial, config.checkpoint)
    yield* Effect.logInfo(`checkpoint ${config.checkpoint} is not on this machine: loaded the run's copy into ${initial}; checkpoints made here go to ${path.join(here, "checkpoints")}`)
    return { ...config, checkpoint: initial, checkpointDir: path.join(here, "checkpoints") }
  })

/** The run's last checkpoint on this machine (see the module doc). */
export const finalCheckpoint = (system: ActorSystemShape, config: RunConfig) =>
  Effect.gen(function* () {
    const steps = config.policyConfig.steps
    const local = yield* latestCheckpoint(config.checkpointDir)
    if (local !== undefined && local.state.version === steps) return local.dir
    const weights = yield* fetchWeights(system, steps)
    const dir = checkpointPath(config.checkpointDir, steps)
    yield* Effect.try({
      try: () => {
        fs.mkdirSync(dir, { recursive: true })
        for (const f of [CONFIG_FILE, ...TOKENIZER_FILES]) if (fs.existsSync(path.join(config.checkpoint, f))) fs.copyFileSync(path.join(config.checkpoint, f), path.join(dir, f))
        fs.writeFileSync(path.join(dir, MODEL_FILE), weights)
      },
      catch: (e) => new TransportError({ operation: `write the published v${steps} to ${dir}`, message: messageOf(e) })
    })
    yield* Effect.logInfo(`the last step's core wrote its checkpoint on another machine: v${steps} from the run's weights bucket in ${dir}`)
    return dir
  })
