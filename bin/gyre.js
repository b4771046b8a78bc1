#!/usr/bin/env node
// The `gyre` command: registers the TypeScript loader and hands over to src/cli/main.ts.
import { register } from "tsx/esm/api"

register()
await import("../src/cli/main.ts")
