import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Two cores on CI: run test files two at a time so nats-server children and native
    // compute do not starve each other.
    maxWorkers: 2
  }
})
