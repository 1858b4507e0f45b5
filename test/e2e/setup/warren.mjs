// Starts a real `warren serve` (temporary data dir, free ports) for the
// platform tests and hands its URLs and API key to them; at the end it
// kills what is left and stops the server.
//
// The server also serves its proxy over HTTPS on 443 of a loopback
// address of its own (tlsAddr), so that the SDK's URLs without
// E2B_SANDBOX_URL (https://{port}-{id}.localhost) work as they do against
// E2B: the test processes trust the server's local CA (NODE_EXTRA_CA_CERTS,
// which Node reads at start, so it is set here, before vitest starts
// them) and resolve *.localhost to that address (platform-env.mjs).
import { startWarren, killAll, freePort } from './start-warren.mjs'

export const tlsHost = '127.0.0.7'

let warren

export async function setup({ provide }) {
  // Loopback webhook receivers (the dashboard's test makes one), besides
  // the default refusal of internal addresses.
  // Volumes hold their whole quota of the disk from their create on
  // (issue 22): small ones keep the suite cheap on a shared machine.
  // The admin's dashboard (nodes) on a listener of its own.
  const adminPort = await freePort()
  warren = await startWarren({ tlsAddr: `${tlsHost}:443`, ciSnapshot: true,
    extraArgs: ['--volume-quota', '512', '--webhook-allow-cidr', '127.0.0.0/8', '--admin-addr', `127.0.0.1:${adminPort}`] })
  if (!warren.caFile) throw new Error('warren serve made no local CA for its HTTPS proxy')
  process.env.NODE_EXTRA_CA_CERTS = warren.caFile
  provide('warren', {
    apiUrl: warren.apiUrl, sandboxUrl: warren.sandboxUrl, apiKey: warren.apiKey, accessToken: warren.accessToken,
    proxyPort: warren.proxyPort, tlsHost, caFile: warren.caFile, dataDir: warren.dataDir, adminUrl: `http://127.0.0.1:${adminPort}`,
  })
}

export async function teardown() {
  if (!warren) return
  await killAll(warren).catch(() => {})
  await warren.stop({ removeDataDir: true })
  // A failed test's 500 names only a request ID: the server's errors,
  // with their causes, are here.
  const errors = warren.output().split('\n').filter((l) => /level=ERROR/.test(l))
  if (errors.length) console.error(`warren serve logged ${errors.length} errors:\n${errors.join('\n')}`)
}
