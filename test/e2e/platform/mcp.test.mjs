// Sandbox.create({ mcp }): the SDK creates a sandbox of the mcp-gateway
// template, runs `mcp-gateway --config '<json>'` in it as root, and its
// user connects the official MCP TypeScript client to getMcpUrl() with
// getMcpToken(). The server is an npm one, @modelcontextprotocol/server-
// memory (pinned in package.json), bundled into one file by esbuild and
// pre-pulled into a template built FROM mcp-gateway at the checkout path
// the gateway uses, as E2B's docs advise for custom servers: sandboxes
// here reach neither GitHub nor the npm registry, so neither the clone
// nor `npx` could fetch it at create time.
import { afterAll, beforeAll, describe, expect, test } from 'vitest'
import { Sandbox, SandboxError, Template } from 'e2b'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { buildSync } from 'esbuild'
import { mkdtempSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'

const require = createRequire(import.meta.url)
const key = 'github/modelcontextprotocol/servers'
const checkout = '/home/user/mcp-servers/modelcontextprotocol/servers'
const made = []
let saved, ctxDir, templateName

beforeAll(async () => {
  // getMcpUrl() is https://{getHost(50005)}/mcp: reach it as against E2B.
  saved = process.env.E2B_SANDBOX_URL
  delete process.env.E2B_SANDBOX_URL
  ctxDir = mkdtempSync(path.join(os.tmpdir(), 'warren-mcp-'))
  buildSync({
    entryPoints: [require.resolve('@modelcontextprotocol/server-memory/dist/index.js')],
    bundle: true, platform: 'node', target: 'node18', format: 'esm', logLevel: 'error',
    outfile: path.join(ctxDir, 'memory-server.mjs'),
    banner: { js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
  })
  templateName = `e2e-mcp-${Date.now()}`
  await Template.build(
    Template({ fileContextPath: ctxDir }).fromTemplate('mcp-gateway').copy('memory-server.mjs', `${checkout}/`, { user: 'user' }),
    templateName,
  )
}, 240_000)

afterAll(async () => {
  process.env.E2B_SANDBOX_URL = saved
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  if (ctxDir) rmSync(ctxDir, { recursive: true, force: true })
})

async function connect(sbx, token) {
  const client = new Client({ name: 'warren-e2e', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(sbx.getMcpUrl()), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  })
  await client.connect(transport)
  return client
}

describe('Sandbox.create({ mcp })', () => {
  test('an npm MCP server, listed and called through the MCP TypeScript client', async () => {
    const sbx = await Sandbox.create({
      template: templateName,
      mcp: { [key]: { runCmd: 'node memory-server.mjs', envs: { MEMORY_FILE_PATH: '/home/user/memory.jsonl' } } },
    })
    made.push(sbx.sandboxId)
    expect(sbx.getMcpUrl()).toBe(`https://${sbx.getHost(50005)}/mcp`)
    // The SDK made the token; the file the gateway wrote holds the same.
    const token = await sbx.getMcpToken()
    const fromFile = await sbx.files.read('/etc/mcp-gateway/.token', { user: 'root' })
    expect(fromFile).toBe(token)

    const client = await connect(sbx, token)
    try {
      const { tools } = await client.listTools()
      const names = tools.map((t) => t.name)
      const prefix = 'github-modelcontextprotocol-servers__'
      expect(names).toContain(`${prefix}create_entities`)
      expect(names).toContain(`${prefix}read_graph`)
      expect(names.every((n) => n.startsWith(prefix))).toBe(true)

      const created = await client.callTool({
        name: `${prefix}create_entities`,
        arguments: { entities: [{ name: 'warren', entityType: 'project', observations: ['speaks E2B'] }] },
      })
      expect(created.isError).toBeFalsy()
      const graph = await client.callTool({ name: `${prefix}read_graph`, arguments: {} })
      expect(JSON.parse(graph.content[0].text).entities).toEqual([{ name: 'warren', entityType: 'project', observations: ['speaks E2B'] }])
    } finally {
      await client.close()
    }
    // The server ran as `user`, not as root like the gateway: its file is
    // user's.
    const owner = await sbx.commands.run('stat -c %U /home/user/memory.jsonl')
    expect(owner.stdout.trim()).toBe('user')
    const ps = await sbx.commands.run("ps -o user= -C node")
    expect(ps.stdout.trim()).toBe('user')
  }, 120_000)

  test('a wrong or missing token is 401', async () => {
    const sbx = await Sandbox.create({ template: templateName, mcp: { [key]: { runCmd: 'node memory-server.mjs' } } })
    made.push(sbx.sandboxId)
    const token = await sbx.getMcpToken()
    for (const auth of [undefined, `Bearer ${token}x`, `Bearer ${token.slice(0, -1)}`, token]) {
      const res = await fetch(sbx.getMcpUrl(), {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...(auth ? { Authorization: auth } : {}) },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
      })
      expect(res.status, String(auth)).toBe(401)
      await res.arrayBuffer()
    }
  }, 60_000)

  test('a catalog server is refused, naming what is supported', async () => {
    const err = await Sandbox.create({ mcp: { exa: { apiKey: 'k' } } }).catch((e) => e)
    expect(err).toBeInstanceOf(SandboxError)
    expect(err.message).toMatch(/Failed to start MCP gateway: .*server "exa" is not supported.*github\/<owner>\/<repo>.*Docker/s)
  }, 60_000)

  test('a config that tries to run its server as root or past the checkout is refused', async () => {
    for (const [mcp, want] of [
      [{ [key]: { runCmd: 'node memory-server.mjs', user: 'root' } }, /unknown field "user"/],
      [{ 'github/../../etc': { runCmd: 'id' } }, /github\/<owner>\/<repo>/],
      [{ [key]: { runCmd: 'node memory-server.mjs', envs: { 'LD_PRELOAD=/x': 'y' } } }, /env name/],
    ]) {
      const err = await Sandbox.create({ template: templateName, mcp }).catch((e) => e)
      expect(err).toBeInstanceOf(SandboxError)
      expect(err.message).toMatch(want)
    }
  }, 90_000)

  test('a server whose checkout cannot be cloned fails the create with the cause', async () => {
    // No sandbox here reaches GitHub: the clone fails, and so does the
    // create, with the gateway's error (the SDK kills the sandbox).
    const err = await Sandbox.create({ mcp: { 'github/acme/not-pulled': { runCmd: 'node index.js' } } }).catch((e) => e)
    expect(err).toBeInstanceOf(SandboxError)
    expect(err.message).toMatch(/server "github\/acme\/not-pulled": cloning github.com\/acme\/not-pulled/)
  }, 90_000)
})
