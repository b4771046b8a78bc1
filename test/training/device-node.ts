/**
 * The training device of `fixtures.ts` for a `gyre node --load` child process (configured by
 * GYRE_TEST_DEVICE; it prints `{"event":"claimed",...}` on each claim and holds it
 * GYRE_TEST_HOLD_MS before computing, so a test can kill it mid-micro-batch).
 */
import { trainingDeviceFromEnv } from "./fixtures.ts"

export const TrainingDevice = trainingDeviceFromEnv()
