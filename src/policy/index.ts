/**
 * The scheduling policies by name: what `gyre sim --policy`, the live scheduler and
 * `replay --verify` choose from. `async` is a family (one member per split) and is built with
 * `asyncSplit(rolloutCells)`.
 */
import { asyncSplit } from "./async.ts"
import { colocate } from "./colocate.ts"
import { elasticWith } from "./elastic.ts"
import type { Policy } from "./policy.ts"

export { asyncSplit, colocate }
export type { Policy, Transition } from "./policy.ts"
export { replay } from "./policy.ts"

/** The elastic policy, Gyre's variant (the core rolls out while its step has nothing to train). */
export const elastic = elasticWith("elastic", "gyre")
/** The elastic policy as published (the core stays in its step), kept for comparison. */
export const elasticPublished = elasticWith("elastic-published", "published")

/** Policies that need no parameter, by name. */
export const fixedPolicies: Readonly<Record<string, Policy<any>>> = {
  colocate,
  elastic,
  "elastic-published": elasticPublished
}
