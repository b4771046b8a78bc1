/**
 * The KV-pool flags every command that hosts devices takes (`train`, `demo`, `node`, `serve`):
 * `--kv-blocks` (blocks of 16 tokens in each device's KV pool: the longest context a device
 * holds, and the room its executions' cached contexts share) and `--kv-dtype` (how K and V are
 * stored). `train` and `demo` write them into the run's configuration, so devices of other
 * machines (`gyre node --run R --devices K`) read them from the journal; a `gyre node` flag
 * overrides the journal's value for that node's devices only.
 */
import type { KvDtype } from "../engine/config.ts"
import { DEFAULT_KV_BLOCKS, KV_BLOCK_TOKENS } from "../serving/rollout-role.ts"
import { UsageError } from "./args.ts"

/** At most 2^30 tokens in one pool (positions are 32-bit in the engine). */
const MAX_KV_BLOCKS = 2 ** 30 / KV_BLOCK_TOKENS

export const kvFlags = {
  "kv-blocks": {
    kind: "integer",
    doc: `KV-cache blocks of ${KV_BLOCK_TOKENS} tokens per device: the longest context a device holds (a longer prompt is a 400 naming this flag) and the room its cached contexts share (least recently used ones are evicted and prefilled again from the gateway's tokens)`,
    default: DEFAULT_KV_BLOCKS
  },
  "kv-dtype": {
    kind: "string",
    doc: "how the devices' KV caches store K and V: f16 halves their memory, the bytes a long-context decode step reads and the KV handed off at a switch (attention still sums in F32)",
    default: "f32",
    choices: ["f32", "f16"]
  }
} as const

/** `gyre node`'s: the same flags, defaulting to the run's configuration (then to the defaults above). */
export const nodeKvFlags = {
  "kv-blocks": { kind: "integer", doc: `${kvFlags["kv-blocks"].doc}; default: the run's configuration, else ${DEFAULT_KV_BLOCKS}` },
  "kv-dtype": { kind: "string", doc: `${kvFlags["kv-dtype"].doc}; default: the run's configuration, else f32`, choices: ["f32", "f16"] }
} as const

/** `--kv-blocks` checked (one line, exit 2 when out of range); the dtype typed. */
export const checkKvFlags = (command: string, f: { readonly "kv-blocks"?: number | undefined; readonly "kv-dtype"?: string | undefined }) => {
  const blocks = f["kv-blocks"]
  if (blocks !== undefined && (blocks < 1 || blocks > MAX_KV_BLOCKS)) {
    throw new UsageError(`gyre ${command}: --kv-blocks must be between 1 and ${MAX_KV_BLOCKS} (blocks of ${KV_BLOCK_TOKENS} tokens), got ${blocks}`)
  }
  return { kvBlocks: blocks, kvDtype: f["kv-dtype"] as KvDtype | undefined }
}
