// envd with an access token, as the platform will run it. Debug mode has no
// token (so no signed URLs), so this file starts a second envd with one and
// builds the Sandbox object the way Sandbox.create does after the platform
// answers: id, envd version, token and (via sandboxUrl) where envd is.
import { describe, test, expect, beforeAll, afterAll } from 'vitest'
import { Sandbox, AuthenticationError } from 'e2b'
import { startEnvd } from '../setup/start-envd.mjs'

const token = 'e2e-token-' + Math.random().toString(36).slice(2)
let envd
let sbx

function connect(envdAccessToken) {
  return new Sandbox({
    sandboxId: 'e2etoken',
    envdVersion: '0.6.4',
    envdAccessToken,
    sandboxUrl: envd.url,
    debug: false,
  })
}

// post uploads one file to a (signed) upload URL the way a browser form would.
function post(url, name, text) {
  const form = new FormData()
  form.append('file', new Blob([text]), name)
  return fetch(url, { method: 'POST', body: form })
}

beforeAll(async () => {
  envd = await startEnvd({ port: 'any', token })
  sbx = connect(token)
})
afterAll(async () => {
  await envd?.stop()
})

describe('access token', () => {
  test('the right token works for RPC and /files', async () => {
    expect((await sbx.commands.run('whoami')).stdout).toBe('user\n')
    await sbx.files.write('/tmp/e2e-token.txt', 'tok')
    expect(await sbx.files.read('/tmp/e2e-token.txt')).toBe('tok')
  })

  test('a wrong or missing token is refused with AuthenticationError; /health stays open', async () => {
    for (const other of [connect('wrong'), connect(undefined)]) {
      await expect(other.commands.run('true')).rejects.toBeInstanceOf(AuthenticationError)
      await expect(other.files.list('/tmp')).rejects.toBeInstanceOf(AuthenticationError)
      await expect(other.files.read('/tmp/e2e-token.txt')).rejects.toBeInstanceOf(AuthenticationError)
      await expect(other.files.write('/tmp/e2e-token.txt', 'x')).rejects.toBeInstanceOf(AuthenticationError)
      expect(await other.isRunning()).toBe(true)
    }
    expect(await sbx.files.read('/tmp/e2e-token.txt')).toBe('tok')
  })
})

describe('signed URLs', () => {
  test('uploadUrl and downloadUrl work without the token header', async () => {
    const up = await sbx.uploadUrl('/tmp/e2e-signed.txt')
    expect(new URL(up).searchParams.get('signature')).toMatch(/^v1_/)
    const res = await post(up, 'e2e-signed.txt', 'signed')
    expect(res.status).toBe(200)
    expect((await res.json())[0].path).toBe('/tmp/e2e-signed.txt')

    const down = await fetch(await sbx.downloadUrl('/tmp/e2e-signed.txt'))
    expect(down.status).toBe(200)
    expect(await down.text()).toBe('signed')
  })

  test('user and expiration are part of the signature', async () => {
    const up = await sbx.uploadUrl('e2e-signed-root.txt', { user: 'root', useSignatureExpiration: 60 })
    const res = await post(up, 'x', 'as root')
    expect(res.status).toBe(200)
    expect((await res.json())[0].path).toBe('/root/e2e-signed-root.txt')
    expect((await sbx.files.getInfo('/root/e2e-signed-root.txt')).owner).toBe('root')

    const down = await sbx.downloadUrl('e2e-signed-root.txt', { user: 'root', useSignatureExpiration: 60 })
    expect(await (await fetch(down)).text()).toBe('as root')
    await sbx.files.remove('/root/e2e-signed-root.txt')
  })

  test('tampered, expired or wrong-operation signatures are refused with 401', async () => {
    await sbx.files.write('/tmp/e2e-other.txt', 'other')
    const down = await sbx.downloadUrl('/tmp/e2e-signed.txt')
    const otherPath = down.replace('e2e-signed.txt', 'e2e-other.txt')
    expect((await fetch(otherPath)).status).toBe(401)
    const otherUser = new URL(down)
    otherUser.searchParams.set('username', 'root')
    expect((await fetch(otherUser)).status).toBe(401)
    expect((await fetch(await sbx.downloadUrl('/tmp/e2e-signed.txt', { useSignatureExpiration: -10 }))).status).toBe(401)
    // A read signature does not allow writing.
    expect((await post(down, 'x', 'overwrite')).status).toBe(401)
    expect((await fetch(`${envd.url}/files?path=/tmp/e2e-signed.txt`)).status).toBe(401)
    expect(await sbx.files.read('/tmp/e2e-signed.txt')).toBe('signed')
    await sbx.files.remove('/tmp/e2e-signed.txt')
    await sbx.files.remove('/tmp/e2e-other.txt')
    await sbx.files.remove('/tmp/e2e-token.txt')
  })
})

describe('envd without a token', () => {
  test('refuses every SDK call with AuthenticationError until it has one; /health stays open', async () => {
    const bare = await startEnvd({ port: 'any', insecure: false })
    try {
      const other = new Sandbox({ sandboxId: 'e2enotoken', envdVersion: '0.6.4', sandboxUrl: bare.url, debug: false })
      await expect(other.commands.run('true')).rejects.toBeInstanceOf(AuthenticationError)
      await expect(other.files.list('/tmp')).rejects.toBeInstanceOf(AuthenticationError)
      await expect(other.files.write('/tmp/e2e-notoken.txt', 'x')).rejects.toBeInstanceOf(AuthenticationError)
      expect(await other.isRunning()).toBe(true)
      const init = await fetch(`${bare.url}/init`, { method: 'POST', body: JSON.stringify({ accessToken: 'mine' }) })
      expect(init.status).toBe(401)
      expect(await init.json()).toMatchObject({ code: 401 })
    } finally {
      await bare.stop()
    }
  })

  test('a signed upload URL does not unlock /files/compose', async () => {
    await sbx.files.write('/tmp/e2e-compose-victim.txt', 'victim')
    const up = new URL(await sbx.uploadUrl('/tmp/e2e-compose-upload.txt', { user: 'root' }))
    up.pathname = '/files/compose'
    const body = JSON.stringify({ source_paths: ['/tmp/e2e-compose-victim.txt'], destination: '/tmp/e2e-compose-stolen.txt', username: 'root' })
    const res = await fetch(up, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body })
    expect(res.status).toBe(401)
    expect(await sbx.files.read('/tmp/e2e-compose-victim.txt')).toBe('victim')
    expect(await sbx.files.exists('/tmp/e2e-compose-stolen.txt')).toBe(false)
    await sbx.files.remove('/tmp/e2e-compose-victim.txt')
  })
})
