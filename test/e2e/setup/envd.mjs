// Starts a real bin/envd on localhost:49983, where the E2B SDK in debug mode
// (E2B_DEBUG=true) sends every sandbox call, and stops it after the run.
import { startEnvd } from './start-envd.mjs'

let envd

export async function setup() {
  envd = await startEnvd()
}

export async function teardown() {
  await envd?.stop()
}
