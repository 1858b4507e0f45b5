// Starts a real `warren serve` (temporary data dir, free ports) for the
// platform tests and hands its URLs and API key to them; at the end it
// kills what is left and stops the server.
import { startWarren, killAll } from './start-warren.mjs'

let warren

export async function setup({ provide }) {
  warren = await startWarren()
  provide('warren', { apiUrl: warren.apiUrl, sandboxUrl: warren.sandboxUrl, apiKey: warren.apiKey, accessToken: warren.accessToken, proxyPort: warren.proxyPort })
}

export async function teardown() {
  if (!warren) return
  await killAll(warren).catch(() => {})
  await warren.stop({ removeDataDir: true })
}
