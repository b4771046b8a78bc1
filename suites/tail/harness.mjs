#!/usr/bin/env node
/** The `tail` suite's harness: the toy harness with this execution's heavy-tailed horizon (`horizon.mjs`). */
import { horizonOf } from "./horizon.mjs"

process.env.TOY_STEPS = String(horizonOf(process.env))
await import("../toy/harness.mjs")
