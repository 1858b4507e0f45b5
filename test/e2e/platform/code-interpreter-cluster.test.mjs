// The code interpreter in cluster mode: one `--role api` and one `--role
// node` on PostgreSQL (setup/start-cluster.mjs). runCode reaches port
// 49999 through the api's proxy, which honours the traffic token of a
// sandbox made with allowPublicTraffic: false, and /execute takes the
// envd access token, as on one box.
import { afterAll, beforeAll, expect, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'
import { startCluster } from '../setup/start-cluster.mjs'

let c, opts
beforeAll(async () => {
  c = await startCluster({ nodes: { ci: { prefix: 'wcci', net16: 146 } }, apis: 1 })
  opts = c.apis[0].opts
}, 120_000)

afterAll(async () => {
  await c?.stop()
}, 120_000)

// execute posts a cell to /execute through the api's proxy with headers.
async function execute(s, headers) {
  const res = await fetch(`${opts.sandboxUrl}/execute`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '49999', ...headers },
    body: JSON.stringify({ code: '6 * 7' }),
    signal: AbortSignal.timeout(60_000),
  })
  const body = await res.text()
  return { status: res.status, body, lines: () => body.trim().split('\n').map((l) => JSON.parse(l)) }
}

test('runCode through the api: state across cells, a DataFrame, on the node', async () => {
  const s = await Sandbox.create({ ...opts, timeoutMs: 120_000 })
  try {
    expect(c.nodeOf(s.sandboxId)).toBe('ci')
    expect((await s.runCode('x = 20; x', { timeoutMs: 60_000 })).text).toBe('20')
    expect((await s.runCode('x + 22', { timeoutMs: 60_000 })).text).toBe('42')
    const df = await s.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2]})', { timeoutMs: 60_000 })
    expect(df.results[0].data).toEqual({ a: [1, 2] })
    // /execute without the envd access token: 401, as on one box.
    const anon = await execute(s, {})
    expect(anon.status).toBe(401)
    const ok = await execute(s, { 'X-Access-Token': s.envdAccessToken })
    expect(ok.status).toBe(200)
    const lines = ok.lines()
    expect(lines.find((e) => e.type === 'result')).toMatchObject({ is_main_result: true, text: '42' })
    expect(lines.at(-1)).toEqual({ type: 'end_of_execution' })
  } finally {
    await s.kill()
  }
}, 180_000)

test('allowPublicTraffic: false: port 49999 needs the traffic token through the api', async () => {
  const s = await Sandbox.create({ ...opts, timeoutMs: 120_000, network: { allowPublicTraffic: false } })
  try {
    expect(s.trafficAccessToken).toBeTruthy()
    // The SDK sends both tokens.
    expect((await s.runCode('"private"', { timeoutMs: 60_000 })).text).toBe('private')
    const token = { 'X-Access-Token': s.envdAccessToken }
    expect((await execute(s, token)).status).toBe(403)
    expect((await execute(s, { ...token, 'E2B-Traffic-Access-Token': 'not-the-token' })).status).toBe(403)
    // The traffic token alone passes the proxy, not /execute.
    expect((await execute(s, { 'E2B-Traffic-Access-Token': s.trafficAccessToken })).status).toBe(401)
    const both = await execute(s, { ...token, 'E2B-Traffic-Access-Token': s.trafficAccessToken })
    expect(both.status).toBe(200)
    expect(both.lines().at(-1)).toEqual({ type: 'end_of_execution' })
  } finally {
    await s.kill()
  }
}, 180_000)
