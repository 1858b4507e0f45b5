// Points the SDK at the Warren started by setup/warren.mjs, the way a
// user does: E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL (the volume
// content API is on the API's address) and E2B_API_KEY; no debug mode.
// Names under E2B_DOMAIN resolve to the server's HTTPS address, as
// wildcard DNS for the domain would (this machine's resolver has no
// *.localhost); a test that unsets E2B_SANDBOX_URL reaches sandboxes by
// https://{port}-{id}.localhost on 443 like the SDK does against E2B.
import dns from 'node:dns'
import { inject } from 'vitest'

const w = inject('warren')
process.env.E2B_API_URL = w.apiUrl
process.env.E2B_SANDBOX_URL = w.sandboxUrl
process.env.E2B_VOLUME_API_URL = w.apiUrl
process.env.E2B_API_KEY = w.apiKey
process.env.E2B_DOMAIN = 'localhost'
delete process.env.E2B_DEBUG

if (!dns.lookup.warrenDomain) {
  const lookup = dns.lookup
  const ours = (host) => typeof host === 'string' && host.toLowerCase().endsWith('.localhost')
  const patched = function (host, options, callback) {
    if (typeof options === 'function') [options, callback] = [{}, options]
    if (!ours(host)) return lookup.call(this, host, options, callback)
    const opts = typeof options === 'number' ? { family: options } : (options ?? {})
    if (opts.all) return process.nextTick(callback, null, [{ address: w.tlsHost, family: 4 }])
    return process.nextTick(callback, null, w.tlsHost, 4)
  }
  patched.warrenDomain = true
  dns.lookup = patched
}
