/**
 * The gateway type `bench:long-context` runs in a `gyre node` child of its own
 * (`--load bench/gateway-node.ts --spawn gateway/main`), so its memory is measured alone.
 */
import { gateway } from "../src/actors/gateway.ts"

export const gatewayNode = gateway({ port: 0 })
