// Details where Warren's envd once differed from E2B's, each checked against
// E2B's envd source (e2b-dev/infra packages/envd and
// packages/shared/pkg/filesystem) and against E2B's own SDK tests: entry
// modes, symlinks, removing what is not there, the expired signature's
// message, an unknown user's message.
import { describe, test, expect, beforeAll, afterAll } from 'vitest'
import { Sandbox, FileType, AuthenticationError } from 'e2b'
import { startEnvd } from '../setup/start-envd.mjs'

let sbx
let dir
beforeAll(async () => {
  sbx = await Sandbox.create()
  dir = `/home/user/e2e-details-${Date.now()}`
  await sbx.files.makeDir(dir)
})
afterAll(async () => {
  await sbx.files.remove(dir).catch(() => {})
})

describe('entry info', () => {
  test('mode is the permission bits only, for files and directories, in getInfo and list', async () => {
    await sbx.files.makeDir(`${dir}/sub`)
    await sbx.files.write(`${dir}/f.txt`, 'test')
    await sbx.commands.run(`chmod 755 ${dir}/sub && chmod 644 ${dir}/f.txt && mkdir ${dir}/sticky && chmod 1777 ${dir}/sticky`)

    const d = await sbx.files.getInfo(`${dir}/sub`)
    expect(d.type).toBe(FileType.DIR)
    expect(d.mode).toBe(0o755)
    expect(d.permissions).toBe('drwxr-xr-x')
    const f = await sbx.files.getInfo(`${dir}/f.txt`)
    expect(f.mode).toBe(0o644)
    expect(f.permissions).toBe('-rw-r--r--')
    // No sticky bit in mode; permissions still shows it.
    const s = await sbx.files.getInfo(`${dir}/sticky`)
    expect(s.mode).toBe(0o777)
    expect(s.permissions).toBe('dtrwxrwxrwx')

    const byName = Object.fromEntries((await sbx.files.list(dir)).map((e) => [e.name, e]))
    expect(byName.sub.mode).toBe(0o755)
    expect(byName.sub.type).toBe(FileType.DIR)
    expect(byName['f.txt'].mode).toBe(0o644)
    expect(byName['f.txt'].symlinkTarget).toBeUndefined()
  })

  test("a symlink reports its target's type and mode, and the resolved target", async () => {
    await sbx.files.write(`${dir}/target.txt`, 'x')
    await sbx.files.makeDir(`${dir}/tdir`)
    await sbx.commands.run(
      `cd ${dir} && chmod 600 target.txt && chmod 750 tdir && ln -s target.txt l1 && ln -s l1 l2 && ln -s tdir dl && ln -s nowhere dangling`)

    for (const name of ['l1', 'l2']) {
      const l = await sbx.files.getInfo(`${dir}/${name}`)
      expect(l.name).toBe(name)
      expect(l.type).toBe(FileType.FILE)
      expect(l.mode).toBe(0o600)
      expect(l.permissions).toBe('Lrwxrwxrwx')
      expect(l.symlinkTarget).toBe(`${dir}/target.txt`)
    }
    const dl = await sbx.files.getInfo(`${dir}/dl`)
    expect(dl.type).toBe(FileType.DIR)
    expect(dl.mode).toBe(0o750)
    expect(dl.symlinkTarget).toBe(`${dir}/tdir`)

    // A link that leads nowhere: no type, mode 0, and its own path as
    // target (E2B's envd falls back to the path it could not resolve).
    const dangling = await sbx.files.getInfo(`${dir}/dangling`)
    expect(dangling.type).toBeUndefined()
    expect(dangling.mode).toBe(0)
    expect(dangling.symlinkTarget).toBe(`${dir}/dangling`)

    // The same in a listing; a linked directory is not descended into.
    const listed = Object.fromEntries((await sbx.files.list(dir, { depth: 3 })).map((e) => [e.path, e]))
    expect(listed[`${dir}/dl`].type).toBe(FileType.DIR)
    expect(listed[`${dir}/dl`].symlinkTarget).toBe(`${dir}/tdir`)
    expect(listed[`${dir}/l2`].type).toBe(FileType.FILE)
    expect(Object.keys(listed).some((p) => p.startsWith(`${dir}/dl/`))).toBe(false)
  })
})

describe('remove', () => {
  test('removing a path that does not exist succeeds', async () => {
    await expect(sbx.files.remove(`${dir}/never-was`)).resolves.toBeUndefined()
    await expect(sbx.files.remove('never-was-either.txt')).resolves.toBeUndefined()
    // A real one still goes, and a second remove of it succeeds too.
    await sbx.files.write(`${dir}/once.txt`, 'x')
    await sbx.files.remove(`${dir}/once.txt`)
    expect(await sbx.files.exists(`${dir}/once.txt`)).toBe(false)
    await sbx.files.remove(`${dir}/once.txt`)
  })
})

describe('unknown users', () => {
  test("RPC calls say invalid username: '<name>'", async () => {
    const err = await sbx.commands.run('whoami', { user: 'nosuchuser123' }).catch((e) => e)
    expect(err).toBeInstanceOf(AuthenticationError)
    // The ConnectError's message is "[unauthenticated] " and envd's words.
    expect(err.message).toBe("[unauthenticated] invalid username: 'nosuchuser123'")
    const ferr = await sbx.files.list('/tmp', { user: 'nosuchuser123' }).catch((e) => e)
    expect(ferr).toBeInstanceOf(AuthenticationError)
    expect(ferr.message).toBe("[unauthenticated] invalid username: 'nosuchuser123'")
  })

  test("/files says error looking up user '<name>'", async () => {
    const err = await sbx.files.read('/etc/hostname', { user: 'nosuchuser123' }).catch((e) => e)
    expect(err).toBeInstanceOf(AuthenticationError)
    expect(err.message).toContain("error looking up user 'nosuchuser123': user: unknown user nosuchuser123")
  })
})

describe('signatures', () => {
  // Debug mode has no token, so no signatures: an envd of its own with one.
  const token = 'e2e-details-' + Math.random().toString(36).slice(2)
  let envd
  let signed
  beforeAll(async () => {
    envd = await startEnvd({ port: 'any', token })
    signed = new Sandbox({ sandboxId: 'e2edetails', envdVersion: '0.6.4', envdAccessToken: token, sandboxUrl: envd.url, debug: false })
    await signed.files.write('/tmp/e2e-details-signed.txt', 'hello world')
  })
  afterAll(async () => {
    await envd?.stop()
  })

  test("an expired download or upload URL: 401 'signature is already expired' (E2B's test)", async () => {
    const down = await signed.downloadUrl('/tmp/e2e-details-signed.txt', { useSignatureExpiration: -10_000 })
    const res = await fetch(down)
    expect(res.status).toBe(401)
    expect(await res.json()).toEqual({ code: 401, message: 'signature is already expired' })

    const up = await signed.uploadUrl('/tmp/e2e-details-signed.txt', { useSignatureExpiration: -100_000 })
    const form = new FormData()
    form.append('file', 'file content')
    const ures = await fetch(up, { method: 'POST', body: form })
    expect(ures.status).toBe(401)
    expect(await ures.json()).toEqual({ code: 401, message: 'signature is already expired' })
    expect(await signed.files.read('/tmp/e2e-details-signed.txt')).toBe('hello world')
  })

  test('a forged signature is only invalid, expired or not: nothing tells which part failed', async () => {
    const down = new URL(await signed.downloadUrl('/tmp/e2e-details-signed.txt', { useSignatureExpiration: -10_000 }))
    const sig = down.searchParams.get('signature')
    down.searchParams.set('signature', sig.slice(0, -2) + (sig.endsWith('AA') ? 'BB' : 'AA'))
    const res = await fetch(down)
    expect(res.status).toBe(401)
    expect(await res.json()).toEqual({ code: 401, message: 'invalid signature' })
    // And a URL without one.
    const bare = await fetch(`${envd.url}/files?path=/tmp/e2e-details-signed.txt`)
    expect(bare.status).toBe(401)
  })
})
