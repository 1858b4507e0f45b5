// Signed URLs through the sandbox-URL proxy: with E2B_SANDBOX_URL set,
// uploadUrl() and downloadUrl() are http://<proxy>/files?path=…&signature=…
// and name no sandbox; the proxy finds the sandbox whose envd token made
// the signature. These are E2B's own signing tests (tests/sandbox/files/
// signing.test.ts), plus what must not work.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import { Sandbox } from 'e2b'

const w = inject('warren')
let sbx
let other
beforeAll(async () => {
  sbx = await Sandbox.create({ secure: true })
  other = await Sandbox.create({ secure: true })
})
afterAll(async () => {
  await sbx?.kill().catch(() => {})
  await other?.kill().catch(() => {})
})

function form(content) {
  const f = new FormData()
  f.append('file', content)
  return f
}

describe('signed URLs without a sandbox ID', () => {
  test("the URLs are the proxy's own and name no sandbox", async () => {
    const url = new URL(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
    expect(url.origin).toBe(w.sandboxUrl)
    expect(url.pathname).toBe('/files')
    expect(url.href).not.toContain(sbx.sandboxId)
  })

  test('download with a valid signature, as the default user and as root', async () => {
    await sbx.files.write('hello.txt', 'hello world')
    let res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
    expect(res.status).toBe(200)
    expect(await res.text()).toBe('hello world')

    await sbx.files.write('hello.txt', 'hello root', { user: 'root' })
    res = await fetch(await sbx.downloadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10_000 }))
    expect(res.status).toBe(200)
    expect(await res.text()).toBe('hello root')
    // Without an expiration too.
    res = await fetch(await sbx.downloadUrl('hello.txt'))
    expect(await res.text()).toBe('hello world')
  })

  test('upload with a valid signature, as the default user and as root', async () => {
    let res = await fetch(await sbx.uploadUrl('up.txt', { useSignatureExpiration: 10_000 }), { method: 'POST', body: form('file content') })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual([{ name: 'up.txt', path: '/home/user/up.txt', type: 'file' }])
    expect(await sbx.files.read('up.txt')).toBe('file content')

    res = await fetch(await sbx.uploadUrl('up.txt', { user: 'root', useSignatureExpiration: 10_000 }), { method: 'POST', body: form('root content') })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual([{ name: 'up.txt', path: '/root/up.txt', type: 'file' }])
    expect(await sbx.files.read('/root/up.txt', { user: 'root' })).toBe('root content')
  })

  test("an expired signature: envd's 401 'signature is already expired'", async () => {
    await sbx.files.write('hello.txt', 'hello world')
    let res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 }))
    expect(res.status).toBe(401)
    expect(await res.json()).toEqual({ code: 401, message: 'signature is already expired' })
    res = await fetch(await sbx.uploadUrl('hello.txt', { useSignatureExpiration: -100_000 }), { method: 'POST', body: form('x') })
    expect(res.status).toBe(401)
    expect(await res.json()).toEqual({ code: 401, message: 'signature is already expired' })
    expect(await sbx.files.read('hello.txt')).toBe('hello world')
  })

  test('each URL reaches the sandbox that signed it', async () => {
    await sbx.files.write('/tmp/whose.txt', 'first')
    await other.files.write('/tmp/whose.txt', 'second')
    expect(await (await fetch(await sbx.downloadUrl('/tmp/whose.txt'))).text()).toBe('first')
    expect(await (await fetch(await other.downloadUrl('/tmp/whose.txt'))).text()).toBe('second')
    await fetch(await other.uploadUrl('/tmp/whose.txt'), { method: 'POST', body: form('written by url') })
    expect(await other.files.read('/tmp/whose.txt')).toBe('written by url')
    expect(await sbx.files.read('/tmp/whose.txt')).toBe('first')
  })

  test('a bad signature is only "invalid signature": it names no sandbox and no failing part', async () => {
    await sbx.files.write('/tmp/secret.txt', 'secret')
    const good = new URL(await sbx.downloadUrl('/tmp/secret.txt', { useSignatureExpiration: 10_000 }))
    const variants = []
    const tampered = new URL(good)
    const sig = tampered.searchParams.get('signature')
    tampered.searchParams.set('signature', sig.slice(0, -2) + (sig.endsWith('AA') ? 'BB' : 'AA'))
    variants.push(['tampered signature', tampered, 'GET'])
    const otherPath = new URL(good)
    otherPath.searchParams.set('path', '/etc/shadow')
    variants.push(['another path', otherPath, 'GET'])
    const asRoot = new URL(good)
    asRoot.searchParams.set('username', 'root')
    variants.push(['another user', asRoot, 'GET'])
    const later = new URL(good)
    later.searchParams.set('signature_expiration', String(Number(good.searchParams.get('signature_expiration')) + 3600))
    variants.push(['a later expiration', later, 'GET'])
    variants.push(['a read signature used to write', good, 'POST'])
    for (const [what, url, method] of variants) {
      const res = await fetch(url, { method, body: method === 'POST' ? form('overwrite') : undefined })
      expect(res.status, what).toBe(401)
      expect(await res.json(), what).toEqual({ code: 401, message: 'invalid signature' })
    }
    expect(await sbx.files.read('/tmp/secret.txt')).toBe('secret')

    // A killed sandbox's URL is the same "invalid signature" (no oracle
    // of which sandboxes exist).
    const gone = await Sandbox.create()
    const goneUrl = await gone.downloadUrl('/tmp/x')
    await gone.kill()
    const res = await fetch(goneUrl)
    expect(res.status).toBe(401)
    expect(await res.json()).toEqual({ code: 401, message: 'invalid signature' })
  })

  test('a /files request with neither a route nor a signature is still a 400', async () => {
    const res = await fetch(`${w.sandboxUrl}/files?path=/etc/passwd`)
    expect(res.status).toBe(400)
  })
})
