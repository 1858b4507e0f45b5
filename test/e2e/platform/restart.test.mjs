// Restarting `warren serve` must not touch running sandboxes: they keep
// running, stay listed, and stay reachable. This test runs its own
// server (own data dir, ports, network range) so it can restart it.
import { afterAll, expect, test } from 'vitest'
import { Sandbox } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'

let w
afterAll(async () => {
  if (!w) return
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
})

test('running sandboxes survive a restart of warren serve', async () => {
  w = await startWarren({ instance: 'rst', net16: 175, poolSize: 0 })
  const dataDir = w.dataDir
  const opts = () => ({ apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey })
  const sbx = await Sandbox.create({ ...opts(), metadata: { keep: 'me' } })
  await sbx.commands.run('sleep 600', { background: true })
  await sbx.files.write('/tmp/before', 'written before the restart')
  const before = await Sandbox.getInfo(sbx.sandboxId, opts())

  await w.stop()
  w = await startWarren({ dataDir, instance: 'rst', net16: 175, poolSize: 0 })

  const listed = await Sandbox.list({ ...opts(), query: { metadata: { keep: 'me' } } }).nextItems()
  expect(listed.map((s) => s.sandboxId)).toEqual([sbx.sandboxId])
  const after = await Sandbox.getInfo(sbx.sandboxId, opts())
  expect(after.state).toBe('running')
  expect(after.endAt.getTime()).toBe(before.endAt.getTime())
  // The new server has new ports: reconnect through it.
  const again = await Sandbox.connect(sbx.sandboxId, opts())
  expect(await again.files.read('/tmp/before')).toBe('written before the restart')
  const ps = await again.commands.run('pgrep -x sleep')
  expect(ps.stdout.trim()).not.toBe('')
  expect(await Sandbox.kill(sbx.sandboxId, opts())).toBe(true)
})
