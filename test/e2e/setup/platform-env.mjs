// Points the SDK at the Warren started by setup/warren.mjs, the way a
// user does: E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL (the volume
// content API is on the API's address) and E2B_API_KEY; no debug mode.
import { inject } from 'vitest'

const w = inject('warren')
process.env.E2B_API_URL = w.apiUrl
process.env.E2B_SANDBOX_URL = w.sandboxUrl
process.env.E2B_VOLUME_API_URL = w.apiUrl
process.env.E2B_API_KEY = w.apiKey
process.env.E2B_DOMAIN = 'localhost'
delete process.env.E2B_DEBUG
