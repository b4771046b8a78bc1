import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    // `*.chaos.ts`: faults whose timing makes them flaky under a loaded CI; `npm run test:chaos` sets
    // GYRE_CHAOS_FAULTS and runs them.
    include: ["test/**/*.test.ts", ...(process.env.GYRE_CHAOS_FAULTS === undefined ? [] : ["test/**/*.chaos.ts"])],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Two cores on CI: run test files two at a time so nats-server children and native
    // compute do not starve each other.
    maxWorkers: 2
  }
})
