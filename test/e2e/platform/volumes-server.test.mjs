// Team volumes against a server of their own (small quotas, restarted):
// a quota stops a writer inside the sandbox with ENOSPC and leaves other
// volumes writable; volumes and their mounts survive a restart of
// `warren serve`.
import { afterAll, beforeAll, expect, test } from 'vitest'
import { Sandbox, Volume, VolumeError } from 'e2b'
import { startWarren, killAll } from '../setup/start-warren.mjs'

let w
const opts = () => ({ apiUrl: w.apiUrl, sandboxUrl: w.sandboxUrl, apiKey: w.apiKey })
// The volume content API is on the API's address.
const volOpts = () => ({ ...opts(), headers: {} })

beforeAll(async () => {
  w = await startWarren({ instance: 'vol', net16: 174, poolSize: 0, extraArgs: ['--volume-quota', '64'] })
  process.env.E2B_VOLUME_API_URL = w.apiUrl
})

afterAll(async () => {
  if (!w) return
  await killAll(w).catch(() => {})
  for (const v of await Volume.list(opts()).catch(() => [])) await Volume.destroy(v.volumeId, opts()).catch(() => {})
  await w.stop({ removeDataDir: true })
})

test('a quota stops a writer with ENOSPC and leaves other volumes writable', async () => {
  const full = await Volume.create('full', opts())
  const spare = await Volume.create('spare', opts())
  const sbx = await Sandbox.create({ ...opts(), volumeMounts: { '/full': full, '/spare': spare } })
  const r = await sbx.commands.run('dd if=/dev/zero of=/full/fill bs=1M count=100', { timeoutMs: 60_000 }).catch((e) => e)
  expect(r.exitCode).not.toBe(0)
  expect(r.stderr).toMatch(/No space left on device/)
  expect((await sbx.commands.run('echo fine > /spare/f && cat /spare/f')).stdout).toBe('fine\n')
  // Freed, it takes writes again. A sparse file's size is not data (it
  // neither fills the volume nor gets past it), and a hard link cannot
  // reach into another volume's file system.
  await sbx.commands.run('rm /full/fill')
  expect((await sbx.commands.run('truncate -s 10G /full/sparse && dd if=/dev/zero of=/full/after bs=1M count=20 status=none && ls -s --block-size=1M /full/after | cut -d" " -f1')).stdout).toBe('20\n')
  const past = await sbx.commands.run('dd if=/dev/zero of=/full/sparse bs=1M count=100 conv=notrunc', { timeoutMs: 60_000 }).catch((e) => e)
  expect(past.stderr).toMatch(/No space left on device/)
  const link = await sbx.commands.run('ln /spare/f /full/hl').catch((e) => e)
  expect(link.stderr).toMatch(/Invalid cross-device link/)
  // Through the content API too: 507, and nothing is left of the write.
  const err = await spare.writeFile('/big', new Blob([Buffer.alloc(100 << 20)]), volOpts()).catch((e) => e)
  expect(err).toBeInstanceOf(VolumeError)
  expect(err.message).toMatch(/^507: .*full/)
  expect(await spare.exists('/big', volOpts())).toBe(false)
  expect((await sbx.commands.run('ls -A /spare')).stdout).toBe('f\n')
  await sbx.kill()
})

test('volumes and their mounts survive a restart of warren serve', async () => {
  const vol = await Volume.create('kept', opts())
  const sbx = await Sandbox.create({ ...opts(), volumeMounts: { '/data': vol } })
  await sbx.commands.run('echo before > /data/f')

  const dataDir = w.dataDir
  await w.stop()
  w = await startWarren({ dataDir, instance: 'vol', net16: 174, poolSize: 0, extraArgs: ['--volume-quota', '64'] })
  process.env.E2B_VOLUME_API_URL = w.apiUrl

  expect(await Volume.getInfo(vol.volumeId, opts())).toMatchObject({ name: 'kept', token: vol.token })
  const again = await Sandbox.connect(sbx.sandboxId, opts())
  expect((await again.getInfo()).volumeMounts).toEqual([{ name: 'kept', path: '/data' }])
  expect((await again.commands.run('cat /data/f && echo after >> /data/f')).stdout).toBe('before\n')
  expect(await vol.readFile('/f', volOpts())).toBe('before\nafter\n')
  const other = await Sandbox.create({ ...opts(), volumeMounts: { '/elsewhere': 'kept' } })
  expect((await other.commands.run('cat /elsewhere/f')).stdout).toBe('before\nafter\n')
  const busy = await Volume.destroy(vol.volumeId, opts()).catch((e) => e)
  expect(busy.message).toMatch(/^409: /)
  await Promise.all([again.kill(), other.kill()])
  expect(await Volume.destroy(vol.volumeId, opts())).toBe(true)
})
