// Templates through the SDK: Template() builds (steps, files, start and
// ready commands, cache, failures, background builds), names and tags,
// and the seed's Dockerfile rebuild over REST. Every build really runs
// its steps in build sandboxes of `warren serve`.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest'
import { BuildError, Sandbox, Template, waitForFile, waitForPort } from 'e2b'
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

const w = inject('warren')
const made = []
let ctxDir

async function create(template, opts = {}) {
  const sbx = await Sandbox.create(template, opts)
  made.push(sbx.sandboxId)
  return sbx
}

async function run(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, opts)
  return r.stdout.trim()
}

// api calls Warren's REST API with the team's API key (or a header set).
async function api(method, p, body, headers = { 'X-API-Key': w.apiKey }) {
  const res = await fetch(w.apiUrl + p, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

// waitBuild polls a build's status until it ends and returns it with all
// its log entries.
async function waitBuild(templateId, buildId, { timeoutMs = 240_000 } = {}) {
  const logs = []
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const st = await Template.getBuildStatus({ templateId, buildId }, { logsOffset: logs.length })
    logs.push(...st.logEntries)
    if ((st.status === 'ready' || st.status === 'error') && st.logEntries.length === 0) return { ...st, logs }
    if (Date.now() > deadline) throw new Error(`build ${buildId} still ${st.status}`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

beforeAll(() => {
  ctxDir = mkdtempSync(path.join(os.tmpdir(), 'warren-tpl-'))
  writeFileSync(path.join(ctxDir, 'server.py'), [
    'import http.server, socketserver',
    'open("/tmp/server-started", "w").write("yes")',
    'class H(http.server.BaseHTTPRequestHandler):',
    '    def do_GET(self):',
    '        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from the start command")',
    'socketserver.TCPServer(("0.0.0.0", 8000), H).serve_forever()',
  ].join('\n'))
  mkdirSync(path.join(ctxDir, 'data', 'sub'), { recursive: true })
  writeFileSync(path.join(ctxDir, 'data', 'a.txt'), 'file a\n')
  writeFileSync(path.join(ctxDir, 'data', 'sub', 'b.txt'), 'file b\n')
  writeFileSync(path.join(ctxDir, 'tool.sh'), '#!/bin/sh\necho tool ran\n')
})

afterAll(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  if (ctxDir) rmSync(ctxDir, { recursive: true, force: true })
})

// The template the first tests build: every step type and a start
// command that serves HTTP on 8000.
function fullTemplate() {
  return Template({ fileContextPath: ctxDir })
    .fromTemplate('base')
    .setEnvs({ GREETING: 'hello from ENV', STAGE: 'e2e' })
    .runCmd('echo one > /tmp/one.txt')
    .runCmd(['echo two > /tmp/two.txt', 'echo "$GREETING" >> /tmp/two.txt'])
    .copy('server.py', '/home/user/app/')
    .copy('data', '/opt/data')
    .copy('tool.sh', '/usr/local/bin/tool', { mode: 0o755, user: 'root' })
    .setWorkdir('/home/user/app')
    .setUser('user')
    .runCmd('whoami > who.txt && pwd >> who.txt')
    .setStartCmd('python3 /home/user/app/server.py', waitForPort(8000))
}

describe('SDK builds', () => {
  const name = `e2e-full-${Date.now()}`
  let info

  test('a template with every step type and a start command builds, and its sandboxes show every effect', async () => {
    const logs = []
    info = await Template.build(fullTemplate(), name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (e) => logs.push(e) })
    expect(info.templateId).toMatch(/^[a-z0-9]{20}$/)
    expect(info.name).toBe(name)
    expect(logs.map((e) => e.message).join('\n')).toContain('RUN echo one > /tmp/one.txt')

    const sbx = await create(name)
    expect(sbx.sandboxId).toBeTruthy()
    // ENV
    expect(await run(sbx, 'echo "$GREETING/$STAGE"')).toBe('hello from ENV/e2e')
    // RUN, single and list (joined with &&), with the ENV set
    expect(await run(sbx, 'cat /tmp/one.txt /tmp/two.txt')).toBe('one\ntwo\nhello from ENV')
    // COPY: a file into a directory, a directory's contents, a mode and owner
    expect(await run(sbx, 'stat -c "%U %a" /home/user/app/server.py')).toBe('user 644')
    expect(await run(sbx, 'cat /opt/data/a.txt /opt/data/sub/b.txt')).toBe('file a\nfile b')
    expect(await run(sbx, 'stat -c "%U %a" /usr/local/bin/tool && tool')).toBe('root 755\ntool ran')
    // WORKDIR and USER: the last RUN ran there as user; sandboxes start there as user
    expect(await run(sbx, 'cat /home/user/app/who.txt')).toBe('user\n/home/user/app')
    expect(await run(sbx, 'whoami && pwd')).toBe('user\n/home/user/app')
    // The start command runs (restored from the snapshot, not started again)
    expect(await run(sbx, 'pgrep -f server.py >/dev/null && echo running')).toBe('running')
    expect(await run(sbx, 'curl -s localhost:8000')).toBe('hello from the start command')
    // ...and is reachable through the proxy.
    const res = await fetch(`${w.sandboxUrl}/`, {
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' },
    })
    expect(await res.text()).toBe('hello from the start command')
    // The sandbox's info names the template
    const got = await sbx.getInfo()
    expect(got.templateId).toBe(info.templateId)
    expect(got.name ?? got.alias).toBe(name)
  }, 300_000)

  test('a rebuild with nothing changed is cached and quick; the name and its ID start the same template', async () => {
    const logs = []
    const started = Date.now()
    const again = await Template.build(fullTemplate(), name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (e) => logs.push(e) })
    const took = Date.now() - started
    expect(again.templateId).toBe(info.templateId)
    expect(again.buildId).not.toBe(info.buildId)
    const cached = logs.filter((e) => e.message.includes('cached'))
    // 7 layer steps (3 RUN, 3 COPY, 1 WORKDIR... minus none) and the snapshot
    expect(cached.length).toBeGreaterThanOrEqual(8)
    expect(took).toBeLessThan(30_000)
    const byId = await create(info.templateId)
    expect(await run(byId, 'cat /tmp/one.txt')).toBe('one')
  }, 300_000)

  test('setStartCmd with waitForFile, and skipCache runs every step again', async () => {
    const tpl = Template()
      .skipCache()
      .fromTemplate('base')
      .runCmd('echo built > /tmp/built.txt')
      .setStartCmd('sleep 1 && echo ready > /tmp/ready-file && sleep infinity', waitForFile('/tmp/ready-file'))
    const logs = []
    await Template.build(tpl, `e2e-file-${Date.now()}`, { onBuildLogs: (e) => logs.push(e) })
    expect(logs.some((e) => e.message.includes('cached'))).toBe(false)
    expect(logs.map((e) => e.message).join('\n')).toContain('the ready command succeeded')
  }, 300_000)

  test('buildInBackground, then getBuildStatus pages the log with logsOffset', async () => {
    const tpl = Template().fromTemplate('base').runCmd('for i in 1 2 3 4 5; do echo line-$i; done')
    const bg = await Template.buildInBackground(tpl, `e2e-bg-${Date.now()}`)
    expect(bg.buildId).toBeTruthy()
    const first = await Template.getBuildStatus(bg)
    expect(['waiting', 'building', 'ready']).toContain(first.status)
    const done = await waitBuild(bg.templateId, bg.buildId)
    expect(done.status).toBe('ready')
    const all = done.logs.map((e) => e.message)
    expect(all.join('\n')).toMatch(/line-1[\s\S]*line-5/)
    // From an offset, the entries from there on: the same messages.
    const later = await Template.getBuildStatus(bg, { logsOffset: 3 })
    expect(later.logEntries.map((e) => e.message)).toEqual(all.slice(3, 3 + later.logEntries.length))
    expect(later.logEntries.length).toBe(Math.min(100, all.length - 3))
  }, 300_000)

  test('a failing second RUN fails the build with BuildError and reason.step "2"; nothing is left running', async () => {
    const tpl = Template().fromTemplate('base').runCmd('echo fine').runCmd('echo about to fail && exit 3')
    const nameF = `e2e-fail-${Date.now()}`
    await expect(Template.build(tpl, nameF)).rejects.toThrow(BuildError)
    const bg = await Template.buildInBackground(tpl, nameF)
    const done = await waitBuild(bg.templateId, bg.buildId)
    expect(done.status).toBe('error')
    expect(done.reason.step).toBe('2')
    expect(done.reason.message).toContain('exited with code 3')
    expect(done.logs.map((e) => e.message).join('\n')).toContain('about to fail')
    // The failed build's sandbox is gone: only sandboxes created by tests run.
    const listed = await Sandbox.list().nextItems()
    for (const s of listed) expect(made).toContain(s.sandboxId)
    // A name with no ready build cannot start sandboxes.
    await expect(Sandbox.create(nameF)).rejects.toThrow()
  }, 300_000)

  test('an unknown base template fails at step "base"', async () => {
    const bg = await Template.buildInBackground(Template().fromTemplate('no-such-template-x').runCmd('true'), `e2e-nobase-${Date.now()}`)
    const done = await waitBuild(bg.templateId, bg.buildId)
    expect(done.status).toBe('error')
    expect(done.reason.step).toBe('base')
  }, 120_000)
})

describe('names and tags', () => {
  const name = `e2e-tags-${Date.now()}`
  let built

  beforeAll(async () => {
    built = await Template.build(Template().fromTemplate('base').runCmd('echo v1 > /tmp/version'), `${name}:v1`)
  }, 300_000)

  test('exists, assignTags, getTags, removeTags; create by name:tag, namespace/name:tag and ID', async () => {
    expect(await Template.exists(name)).toBe(true)
    expect(await Template.exists(`no-such-${Date.now()}`)).toBe(false)
    const assigned = await Template.assignTags(`${name}:v1`, ['stable', 'prod'])
    expect(assigned.buildId).toBe(built.buildId)
    const tags = await Template.getTags(name)
    expect(tags.map((t) => t.tag).sort()).toEqual(['prod', 'stable', 'v1'])
    for (const ref of [`${name}:stable`, `team/${name}:prod`, `${name}:v1`]) {
      const sbx = await create(ref)
      expect(await run(sbx, 'cat /tmp/version')).toBe('v1')
      await sbx.kill()
    }
    await Template.removeTags(name, ['prod'])
    expect((await Template.getTags(name)).map((t) => t.tag).sort()).toEqual(['stable', 'v1'])
    await expect(Sandbox.create(`${name}:prod`)).rejects.toThrow()
  }, 120_000)

  test('list, get and delete over REST', async () => {
    const list = await api('GET', '/templates')
    expect(list.status).toBe(200)
    const mine = list.body.find((t) => t.templateID === built.templateId)
    expect(mine.names).toContain(name)
    expect(mine.buildStatus).toBe('ready')
    const got = await api('GET', `/templates/${built.templateId}`)
    expect(got.body.builds.map((b) => b.buildID)).toContain(built.buildId)
    expect((await api('DELETE', `/templates/${built.templateId}`)).status).toBe(204)
    expect((await api('GET', `/templates/${built.templateId}`)).status).toBe(404)
    expect(await Template.exists(name)).toBe(false)
  })
})

describe('REST', () => {
  test('the seed\'s Dockerfile rebuild (Bearer access token) builds, and sandboxes use it', async () => {
    const name = `e2e-docker-${Date.now()}`
    const first = await Template.build(Template().fromTemplate('base').runCmd('true'), name)
    const dockerfile = [
      'FROM e2bdev/base',
      'ENV MESSAGE="from a Dockerfile"',
      'RUN echo "$MESSAGE" > /tmp/msg',
      'WORKDIR /srv',
      'CMD ["python3", "-m", "http.server", "8001"]',
    ].join('\n')
    const bearer = { Authorization: `Bearer ${w.accessToken}` }
    const res = await api('POST', `/templates/${first.templateId}`, { dockerfile, readyCmd: 'curl -sf localhost:8001 >/dev/null', cpuCount: 1, memoryMB: 256 }, bearer)
    expect(res.status).toBe(202)
    expect(res.body.templateID).toBe(first.templateId)
    expect(res.body.buildID).not.toBe(first.buildId)
    expect(res.body.memoryMB).toBe(256)
    const done = await waitBuild(first.templateId, res.body.buildID)
    expect(done.status).toBe('ready')
    const sbx = await create(name)
    expect(await run(sbx, 'cat /tmp/msg && echo "$MESSAGE" && pwd')).toBe('from a Dockerfile\nfrom a Dockerfile\n/srv')
    expect(await run(sbx, 'curl -s -o /dev/null -w "%{http_code}" localhost:8001')).toBe('200')

    // Bad input gets E2B's error body.
    const bad = await api('POST', `/templates/${first.templateId}`, { dockerfile: 'FROM base\nEXPOSE 80' }, bearer)
    expect(bad.status).toBe(400)
    expect(bad.body.message).toMatch(/EXPOSE/)
    const tooSmall = await api('POST', '/v3/templates', { name: 'x', memoryMB: 64 })
    expect(tooSmall).toEqual({ status: 400, body: { code: 400, message: expect.stringMatching(/memoryMB/) } })
    const noAuth = await api('POST', `/templates/${first.templateId}`, { dockerfile }, {})
    expect(noAuth.status).toBe(401)
  }, 300_000)
})
