// Errors by cause through the SDK (issue 24): a server with room for one
// sandbox answers a create, a resume and a connect beyond it with 503 and
// E2B's error_code sandbox_capacity_unavailable, which the SDK raises as
// ServiceBusyError (it keeps the message, not the code: the code is seen
// in the raw answer).
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { afterAll, beforeAll, describe, expect, test } from 'vitest'
import { Sandbox, ServiceBusyError } from 'e2b'
import { killAll, startWarren } from '../setup/start-warren.mjs'

let w
let opts
beforeAll(async () => {
  w = await startWarren({ instance: 'cap', net16: 141, poolSize: 0, extraArgs: ['--max-sandboxes', '1'] })
  opts = { apiKey: w.apiKey, apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl }
}, 120_000)
afterAll(async () => {
  if (!w) return
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
})

async function api(method, p, body) {
  const res = await fetch(w.apiUrl + p, {
    method, headers: { 'Content-Type': 'application/json', 'X-API-Key': w.apiKey },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

describe('capacity', () => {
  test('create beyond the node: 503 sandbox_capacity_unavailable, ServiceBusyError', async () => {
    const first = await Sandbox.create(opts)
    try {
      const err = await Sandbox.create(opts).then(() => null, (e) => e)
      expect(err).toBeInstanceOf(ServiceBusyError)
      const raw = await api('POST', '/sandboxes', { templateID: 'base' })
      expect(raw.status).toBe(503)
      expect(raw.body.code).toBe(503)
      expect(raw.body.error_code).toBe('sandbox_capacity_unavailable')
      expect(err.message).toContain(raw.body.message)
      // Nothing half-made: one sandbox, still working.
      expect((await api('GET', '/v2/sandboxes')).body.map((s) => s.sandboxID)).toEqual([first.sandboxId])
      expect((await first.commands.run('echo alive')).stdout).toBe('alive\n')
    } finally {
      await first.kill()
    }
  })

  test('resume and connect beyond the node: the same code', async () => {
    const paused = await Sandbox.create(opts)
    await paused.pause()
    const other = await Sandbox.create(opts)
    try {
      const resume = await api('POST', `/sandboxes/${paused.sandboxId}/resume`, {})
      expect(resume.status).toBe(503)
      expect(resume.body.error_code).toBe('sandbox_capacity_unavailable')
      const connect = await api('POST', `/sandboxes/${paused.sandboxId}/connect`, { timeout: 60 })
      expect(connect.status).toBe(503)
      expect(connect.body.error_code).toBe('sandbox_capacity_unavailable')
      const err = await Sandbox.connect(paused.sandboxId, opts).then(() => null, (e) => e)
      expect(err).toBeInstanceOf(ServiceBusyError)
      expect((await Sandbox.getInfo(paused.sandboxId, opts)).state).toBe('paused')
      await other.kill()
      // Room again: the paused one resumes with its state.
      const back = await Sandbox.connect(paused.sandboxId, opts)
      expect((await back.commands.run('echo back')).stdout).toBe('back\n')
    } finally {
      await Sandbox.kill(other.sandboxId, opts).catch(() => {})
      await Sandbox.kill(paused.sandboxId, opts).catch(() => {})
    }
  }, 120_000)
})

describe('create failed', () => {
  // A real cause: the node tries and fails. A paused sandbox whose memory
  // checkpoint was damaged on disk cannot be restored: 500
  // sandbox_create_failed (E2B's code for a node that tried and failed),
  // and the sandbox is still paused, not half-resumed.
  test('a resume whose checkpoint is damaged: 500 sandbox_create_failed; it stays paused', async () => {
    const sbx = await Sandbox.create(opts)
    try {
      await sbx.pause()
      const images = execFileSync('find', [w.dataDir, '-name', 'checkpoint.img', '-path', `*${sbx.sandboxId}*`], { encoding: 'utf8' }).split('\n').filter(Boolean)
      expect(images.length).toBe(1)
      writeFileSync(images[0], 'not a checkpoint')
      const raw = await api('POST', `/sandboxes/${sbx.sandboxId}/connect`, { timeout: 60 })
      expect(raw.status).toBe(500)
      expect(raw.body.code).toBe(500)
      expect(raw.body.error_code).toBe('sandbox_create_failed')
      expect(raw.body.message).toMatch(/could not be resumed: .* failed; it is still paused/)
      expect(raw.body.message).not.toContain(w.dataDir) // no host path reaches a client
      expect((await Sandbox.getInfo(sbx.sandboxId, opts)).state).toBe('paused')
    } finally {
      await Sandbox.kill(sbx.sandboxId, opts).catch(() => {})
    }
    // Nothing left running: the node has room for a new one at once.
    const next = await Sandbox.create(opts)
    await next.kill()
  }, 120_000)
})
