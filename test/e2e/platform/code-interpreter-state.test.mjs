// A code-interpreter sandbox's kernels keep their state across a pause
// and resume, and a fork's child starts with its parent's kernels: the
// Python, JavaScript and bash default contexts and a context of its own
// (with its cwd), through @e2b/code-interpreter unchanged.
import { afterAll, expect, inject, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

const made = []

afterAll(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

const stdout = (ex) => ex.logs.stdout.join('')

// seed sets one value in each language's default context and in a
// Python context of its own whose cwd is /tmp; it returns that context.
async function seed(sbx) {
  expect((await sbx.runCode('x = 41')).error).toBeUndefined()
  expect((await sbx.runCode('let jsValue = "from js"', { language: 'js' })).error).toBeUndefined()
  expect((await sbx.runCode('SHELL_VALUE=from-bash; cd /tmp', { language: 'bash' })).error).toBeUndefined()
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  expect((await sbx.runCode('own = "only in its context"', { context: ctx })).error).toBeUndefined()
  return ctx
}

// expectSeeded checks that sbx's kernels hold what seed set.
async function expectSeeded(sbx, ctx) {
  const x = await sbx.runCode('x + 1')
  expect(x.error).toBeUndefined()
  expect(x.text).toBe('42')
  expect((await sbx.runCode('jsValue', { language: 'js' })).text).toBe('from js')
  expect(stdout(await sbx.runCode('echo "$SHELL_VALUE in $(pwd)"', { language: 'bash' }))).toBe('from-bash in /tmp\n')
  const own = await sbx.runCode('import os; (own, os.getcwd())', { context: ctx })
  expect(own.error).toBeUndefined()
  expect(own.text).toBe("('only in its context', '/tmp')")
  // The default context never saw the other context's value.
  expect((await sbx.runCode('own')).error.name).toBe('NameError')
}

// Both sandboxes are private (allowPublicTraffic: false): their port
// 49999 answers only with the traffic token, which the SDK sends, and
// a request without it is refused after a resume or fork as before.
const privateNet = { network: { allowPublicTraffic: false } }

async function expectTokenNeeded(sbx) {
  const { sandboxUrl } = inject('warren')
  const res = await fetch(`${sandboxUrl}/health`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' } })
  expect(res.status).toBe(403)
}

const contextsOf = async (sbx) => (await sbx.listCodeContexts())
  .map((c) => ({ id: c.id, language: c.language, cwd: c.cwd }))
  .sort((a, b) => a.id.localeCompare(b.id))

test('pause and resume keep every context\'s kernel state, and the contexts list', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...privateNet })
  made.push(sbx.sandboxId)
  const ctx = await seed(sbx)
  const before = await contextsOf(sbx)
  expect(before.map((c) => c.id)).toContain(ctx.id)

  for (let round = 0; round < 2; round++) {
    expect(await sbx.pause()).toBe(true)
    expect((await sbx.getInfo()).state).toBe('paused')
    const again = await Sandbox.connect(sbx.sandboxId)
    expect((await again.getInfo()).state).toBe('running')
    await expectSeeded(again, ctx)
    expect(await contextsOf(again)).toEqual(before)
    await expectTokenNeeded(again)
    // The kernel runs new cells, their state kept by the next round.
    const y = await again.runCode(`rounds = globals().get("rounds", 0) + 1; rounds`)
    expect(y.text).toBe(String(round + 1))
  }
}, 240_000)

test('a fork\'s child has its parent\'s kernels; afterwards the two diverge', async () => {
  const parent = await Sandbox.create({ timeoutMs: 300_000, ...privateNet })
  made.push(parent.sandboxId)
  const ctx = await seed(parent)
  const before = await contextsOf(parent)

  const [child] = await parent.fork({ count: 1, timeoutMs: 120_000 })
  expect(child).toBeInstanceOf(Sandbox)
  made.push(child.sandboxId)
  expect(child.sandboxId).not.toBe(parent.sandboxId)

  await expectSeeded(child, ctx)
  expect(await contextsOf(child)).toEqual(before)
  await expectTokenNeeded(child)
  await expectSeeded(parent, ctx)

  // Each changes its own kernels; neither sees the other's change.
  await child.runCode('x = 1')
  await parent.runCode('x = 2')
  await child.runCode('jsValue = "child js"', { language: 'js' })
  await parent.runCode('SHELL_VALUE=parent-bash', { language: 'bash' })
  await child.runCode('own = "child own"', { context: ctx })
  expect((await child.runCode('x')).text).toBe('1')
  expect((await parent.runCode('x')).text).toBe('2')
  expect((await child.runCode('jsValue', { language: 'js' })).text).toBe('child js')
  expect((await parent.runCode('jsValue', { language: 'js' })).text).toBe('from js')
  expect(stdout(await child.runCode('echo $SHELL_VALUE', { language: 'bash' }))).toBe('from-bash\n')
  expect(stdout(await parent.runCode('echo $SHELL_VALUE', { language: 'bash' }))).toBe('parent-bash\n')
  expect((await child.runCode('own', { context: ctx })).text).toBe('child own')
  expect((await parent.runCode('own', { context: ctx })).text).toBe('only in its context')

  // A context made in one after the fork is the other's to know nothing of.
  const late = await child.createCodeContext({ language: 'bash' })
  expect((await contextsOf(child)).map((c) => c.id)).toContain(late.id)
  expect((await contextsOf(parent)).map((c) => c.id)).not.toContain(late.id)
  await expect(parent.runCode('echo hi', { context: late })).rejects.toThrow(/not found/)
}, 240_000)
