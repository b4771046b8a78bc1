/**
 * Agent roles of model calls and their rank for bounded dedup sampling: `main` >
 * `main-summary` > `subagent` > `subagent-summary` > any custom role (all custom roles form
 * one class below the four).
 */
import { Schema } from "effect"

/** The four roles the harness runner knows; any other non-empty name is a custom role. */
export const knownRoles = ["main", "main-summary", "subagent", "subagent-summary"] as const

/** A call's agent role: one of `knownRoles` or a custom name. */
export const AgentRole = Schema.NonEmptyString.annotate({
  description: "agent role: main, main-summary, subagent, subagent-summary, or a custom name"
})
export type AgentRole = typeof AgentRole.Type

/** Class rank of a role: 0 (main) to 3 (subagent-summary); 4 for every custom role. */
export const roleRank = (role: string): number => {
  const rank = (knownRoles as ReadonlyArray<string>).indexOf(role)
  return rank < 0 ? knownRoles.length : rank
}

/** Orders roles best first: by rank, then custom roles by name (deterministic ties). */
export const compareRoles = (a: string, b: string): number => roleRank(a) - roleRank(b) || (a < b ? -1 : a > b ? 1 : 0)
