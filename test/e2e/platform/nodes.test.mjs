// `warren nodes` against a real server: the node registers and heartbeats
// what it runs; cordon refuses new sandboxes (503, through the SDK) while
// the running ones go on; drain pauses them; uncordon takes creates again.
// Its own server (data dir, ports, network range), since it cordons it.
import { afterAll, expect, test } from 'vitest'
import { execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'
import { startWarren, killAll, warrenBinary } from '../setup/start-warren.mjs'

let w
afterAll(async () => {
  if (!w) return
  await killAll(w).catch(() => {})
  await w.stop({ removeDataDir: true })
})

const nodes = (...args) => execFileSync(warrenBinary, ['nodes', ...args, '--data-dir', w.dataDir], { encoding: 'utf8' })
// row is the node's line as [NAME, STATE, SANDBOXES, ...].
const row = () => nodes().trim().split('\n').slice(1).map((l) => l.split(/\s+/)).find((f) => f[0] === 'local')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function until(what, ok) {
  for (let i = 0; i < 50; i++) {
    if (ok()) return
    await sleep(200)
  }
  throw new Error(`not within 10 s: ${what}: ${nodes()}`)
}

test('warren nodes lists, cordons, drains and uncordons the node', async () => {
  w = await startWarren({ instance: 'nod', net16: 138, poolSize: 0 })
  const opts = { apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey }
  expect(nodes().split('\n')[0].split(/\s+/).slice(0, 3)).toEqual(['NAME', 'STATE', 'SANDBOXES'])
  expect(row().slice(0, 3)).toEqual(['local', 'ready', '0'])

  const sbx = await Sandbox.create(opts)
  await until('the heartbeat counts the sandbox', () => row()[2] === '1')

  expect(nodes('cordon', 'local')).toContain('cordoned')
  await until('the node is cordoned', () => row()[1] === 'cordoned')
  await sleep(2500) // a heartbeat brings the state to the server
  await expect(Sandbox.create(opts)).rejects.toThrow(/cordoned/)
  expect((await sbx.commands.run('echo still')).stdout).toBe('still\n')

  const out = nodes('drain', 'local', '--timeout', '60s')
  expect(out).toContain('is drained')
  expect((await Sandbox.getInfo(sbx.sandboxId, opts)).state).toBe('paused')
  expect(row().slice(0, 3)).toEqual(['local', 'draining', '0'])

  // No heartbeat to wait for: a node that believes itself cordoned asks
  // the store again before it refuses (cluster.Member.Admit).
  expect(nodes('uncordon', 'local')).toContain('ready')
  const again = await Sandbox.create(opts)
  expect((await again.commands.run('echo ok')).stdout).toBe('ok\n')
  const resumed = await Sandbox.connect(sbx.sandboxId, opts)
  expect((await resumed.commands.run('echo back')).stdout).toBe('back\n')
  await again.kill()
  await resumed.kill()

  expect(() => nodes('cordon', 'nosuchnode')).toThrow()
  expect(() => nodes('cordon')).toThrow()
}, 120_000)
