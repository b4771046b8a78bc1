/**
 * The trajectory processor: delta-encoded call records -> per-execution prefix trees ->
 * scores and advantages -> training units (exact tree or sampled paths) -> packed
 * micro-batches. Pure: no NATS, no clock, no I/O.
 */
export * from "./advantage.ts"
export * from "./decoder.ts"
export * from "./encoder.ts"
export * from "./hash.ts"
export * from "./outcome.ts"
export * from "./pack.ts"
export * from "./record.ts"
export * from "./role.ts"
export * from "./sample.ts"
export * from "./stats.ts"
export * from "./tree.ts"
export * from "./units.ts"
export * from "./wire.ts"
