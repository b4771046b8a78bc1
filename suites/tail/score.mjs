#!/usr/bin/env node
/** The `tail` suite's scorer: the toy scorer with the horizon the harness had (`horizon.mjs`). */
import { horizonOf } from "./horizon.mjs"

process.env.TOY_STEPS = String(horizonOf(process.env))
await import("../toy/score.mjs")
