import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    // `*.chaos.ts`: run-level faults during `gyre train` (minutes, timing-dependent under load);
    // `npm run test:chaos` sets GYRE_CHAOS_FAULTS and runs them.
    include: ["test/**/*.test.ts", ...(process.env.GYRE_CHAOS_FAULTS === undefined ? [] : ["test/**/*.chaos.ts"])],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Two cores on CI: run test files two at a time so nats-server children and native
    // compute do not starve each other.
    maxWorkers: 2
  }
})
