// @e2b/code-interpreter, unchanged, against Warren's code-interpreter-v1
// template: envd's code interpreter on port 49999 (internal/codeinterp)
// with real Jupyter kernels, through the sandbox proxy.
import { afterAll, beforeAll, expect, inject, test } from 'vitest'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { Sandbox } from '@e2b/code-interpreter'

let sbx

beforeAll(async () => {
  // The SDK's default template is code-interpreter-v1.
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
}, 120_000)

afterAll(async () => {
  await sbx?.kill()
})

test('the default template is code-interpreter-v1, with E2B\'s 2 CPUs and 2048 MB', async () => {
  const info = await sbx.getInfo()
  expect(info.templateId).toBe('code-interpreter-v1')
  expect(info.cpuCount).toBe(2)
  expect(info.memoryMB).toBe(2048)
})

test('a value, and state across cells', async () => {
  const first = await sbx.runCode('x = 1; x')
  expect(first.text).toBe('1')
  expect(first.results[0].isMainResult).toBe(true)
  expect(first.executionCount).toBeGreaterThan(0)
  const second = await sbx.runCode('x += 41; x')
  expect(second.text).toBe('42')
  expect(second.executionCount).toBe(first.executionCount + 1)
})

test('stdout and stderr reach the callbacks and the logs', async () => {
  const out = []
  const err = []
  const ex = await sbx.runCode('import sys\nprint("to stdout")\nprint("to stderr", file=sys.stderr)', {
    onStdout: (m) => out.push(m.line),
    onStderr: (m) => err.push(m.line),
  })
  expect(out.join('')).toBe('to stdout\n')
  expect(err.join('')).toBe('to stderr\n')
  expect(ex.logs.stdout.join('')).toBe('to stdout\n')
  expect(ex.logs.stderr.join('')).toBe('to stderr\n')
  expect(ex.error).toBeUndefined()
})

test('an exception: its name, value and traceback', async () => {
  const errors = []
  const ex = await sbx.runCode('def divide(a):\n    return a / 0\ndivide(1)', { onError: (e) => errors.push(e) })
  expect(ex.error.name).toBe('ZeroDivisionError')
  expect(ex.error.value).toBe('division by zero')
  expect(ex.error.traceback).toContain('divide')
  expect(errors).toHaveLength(1)
  expect(ex.text).toBeUndefined()
})

test('display outputs beside the main result', async () => {
  const ex = await sbx.runCode('from IPython.display import display, HTML, Markdown\ndisplay(HTML("<b>bold</b>"))\ndisplay(Markdown("# title"))\n"done"')
  const html = ex.results.find((r) => r.html)
  expect(html.html).toBe('<b>bold</b>')
  expect(html.isMainResult).toBe(false)
  expect(ex.results.find((r) => r.markdown).markdown).toBe('# title')
  expect(ex.text).toBe('done')
})

test('a matplotlib figure comes back as a PNG', async () => {
  const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()')
  expect(ex.error).toBeUndefined()
  const png = ex.results.find((r) => r.png)
  expect(png).toBeDefined()
  expect(Buffer.from(png.png, 'base64').subarray(1, 4).toString()).toBe('PNG')
})

test('cells run as user in /home/user, with numpy and pandas', async () => {
  const ex = await sbx.runCode('import getpass, os, numpy, pandas\n(getpass.getuser(), os.getcwd(), int(numpy.arange(4).sum()), len(pandas.DataFrame({"a": [1, 2]})))')
  expect(ex.error).toBeUndefined()
  expect(ex.text).toBe("('user', '/home/user', 6, 2)")
})

test('contexts: cwd, isolation, list, restart, remove', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  expect(ctx.id).toBeTruthy()
  expect(ctx.language).toBe('python')
  expect(ctx.cwd).toBe('/tmp')
  expect((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text).toBe('/tmp')

  await sbx.runCode('only_here = 5', { context: ctx })
  expect((await sbx.runCode('only_here', { context: ctx })).text).toBe('5')
  const elsewhere = await sbx.runCode('only_here')
  expect(elsewhere.error.name).toBe('NameError')

  const list = await sbx.listCodeContexts()
  expect(list.map((c) => c.id)).toContain(ctx.id)

  await sbx.restartCodeContext(ctx)
  expect((await sbx.runCode('only_here', { context: ctx })).error.name).toBe('NameError')

  await sbx.removeCodeContext(ctx)
  expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id)
  await expect(sbx.runCode('1', { context: ctx })).rejects.toThrow(/not found/)
})

test('a context and a language together are refused by the SDK', async () => {
  const ctx = await sbx.createCodeContext()
  try {
    await expect(sbx.runCode('1', { context: ctx, language: 'python' })).rejects.toThrow(/context or language/)
  } finally {
    await sbx.removeCodeContext(ctx)
  }
})

test('env vars of one run apply to that run only', async () => {
  const code = 'import os; str(os.environ.get("PER_RUN"))'
  expect((await sbx.runCode(code, { envs: { PER_RUN: 'here' } })).text).toBe('here')
  expect((await sbx.runCode(code)).text).toBe('None')
})

test('a cell past its timeoutMs is cut, and the next cell answers at once', async () => {
  await sbx.runCode('kept = "state kept"')
  await expect(sbx.runCode('import time\ntime.sleep(300)', { timeoutMs: 2_000 })).rejects.toThrow(/timed out/i)
  // Not a timing assertion: had the kernel not been interrupted, this
  // cell would wait for the 300 s sleep and fail its own timeout.
  const next = await sbx.runCode('kept', { timeoutMs: 30_000 })
  expect(next.text).toBe('state kept')
})

test('/execute needs the envd access token', async () => {
  const { sandboxUrl } = inject('warren')
  const res = await fetch(`${sandboxUrl}/execute`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' },
    body: JSON.stringify({ code: '1' }),
  })
  expect(res.status).toBe(401)
})

test('a cell that kills its kernel ends with an error, and the context lives on', async () => {
  const ex = await sbx.runCode('import os, signal\nos.kill(os.getpid(), signal.SIGKILL)')
  expect(ex.error.name).toBe('KernelDied')
  expect((await sbx.runCode('1 + 1')).text).toBe('2')
})

test('bash cells keep their shell\'s state; a failing command is an error', async () => {
  const first = await sbx.runCode('NAME=warren\ncd /tmp\necho "hello $NAME"', { language: 'bash' })
  expect(first.logs.stdout.join('')).toBe('hello warren\n')
  expect(first.error).toBeUndefined()
  const second = await sbx.runCode('echo "$NAME in $(pwd) as $(whoami)"', { language: 'bash' })
  expect(second.logs.stdout.join('')).toBe('warren in /tmp as user\n')
  const failing = await sbx.runCode('ls /no/such/dir', { language: 'bash' })
  expect(failing.logs.stderr.join('')).toContain('No such file')
  expect(failing.error.value).toBe('exit status 2')
  const ctx = await sbx.createCodeContext({ language: 'bash', cwd: '/home/user' })
  expect(ctx.language).toBe('bash')
  expect((await sbx.runCode('pwd', { context: ctx })).logs.stdout.join('')).toBe('/home/user\n')
  await sbx.removeCodeContext(ctx)
})

test('a DataFrame comes back with its data and html', async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "temp": [3.5, 19.0]})')
  expect(ex.error).toBeUndefined()
  const r = ex.results[0]
  expect(r.data).toEqual({ city: ['Oslo', 'Lima'], temp: [3.5, 19.0] })
  expect(r.html).toContain('<table')
  expect(r.html).toContain('Oslo')
})

// Each chart kind is recognised with its data, and has its PNG.
async function chart(code) {
  const ex = await sbx.runCode(`import matplotlib.pyplot as plt\n${code}\nplt.show()`)
  expect(ex.error).toBeUndefined()
  const r = ex.results.find((x) => x.chart)
  expect(r, 'a result with a chart').toBeDefined()
  expect(Buffer.from(r.png, 'base64').subarray(1, 4).toString()).toBe('PNG')
  return r.chart
}

test('a line chart', async () => {
  const c = await chart('plt.plot([1, 2, 3], [10, 20, 15], label="sales")\nplt.title("Sales")\nplt.xlabel("Month")\nplt.ylabel("Revenue (USD)")')
  expect(c.type).toBe('line')
  expect(c.title).toBe('Sales')
  expect(c.x_label).toBe('Month')
  expect(c.y_label).toBe('Revenue (USD)')
  expect(c.y_unit).toBe('USD')
  expect(c.x_scale).toBe('linear')
  expect(c.elements).toEqual([{ label: 'sales', points: [[1, 10], [2, 20], [3, 15]] }])
  expect(c.x_ticks.length).toBe(c.x_tick_labels.length)
})

test('a scatter chart', async () => {
  const c = await chart('plt.scatter([1, 2], [3, 4], label="a")\nplt.scatter([5], [6], label="b")')
  expect(c.type).toBe('scatter')
  expect(c.elements).toEqual([{ label: 'a', points: [[1, 3], [2, 4]] }, { label: 'b', points: [[5, 6]] }])
})

test('a bar chart', async () => {
  const c = await chart('plt.bar(["A", "B", "C"], [5, 7, 3], label="2024")\nplt.title("Votes")')
  expect(c.type).toBe('bar')
  expect(c.title).toBe('Votes')
  expect(c.elements).toEqual([
    { label: 'A', value: '5', group: '2024' },
    { label: 'B', value: '7', group: '2024' },
    { label: 'C', value: '3', group: '2024' },
  ])
})

test('a pie chart', async () => {
  const c = await chart('plt.pie([1, 3], labels=["one", "three"])')
  expect(c.type).toBe('pie')
  expect(c.elements.map((e) => e.label)).toEqual(['one', 'three'])
  expect(c.elements[0].angle).toBeCloseTo(90)
  expect(c.elements[1].angle).toBeCloseTo(270)
  expect(c.elements[0].radius).toBe(1)
})

test('a box plot', async () => {
  const c = await chart('plt.boxplot([[1, 2, 3, 4, 5, 40], [2, 4, 6, 8, 10]], labels=["x", "y"])')
  expect(c.type).toBe('box_and_whisker')
  expect(c.elements).toHaveLength(2)
  const [x, y] = c.elements
  expect(x.label).toBe('x')
  expect(x.median).toBe(3.5)
  expect(x.outliers).toEqual([40])
  expect(x.min).toBe(1)
  expect(x.max).toBe(5)
  expect(y.label).toBe('y')
  expect(y).toMatchObject({ min: 2, first_quartile: 4, median: 6, third_quartile: 8, max: 10, outliers: [] })
})

test('several axes make a superchart', async () => {
  const c = await chart('fig, (a, b) = plt.subplots(1, 2)\nfig.suptitle("Both")\na.plot([1, 2], [3, 4])\nb.bar(["p"], [1])')
  expect(c.type).toBe('superchart')
  expect(c.title).toBe('Both')
  expect(c.elements.map((e) => e.type)).toEqual(['line', 'bar'])
})

test('the envs of a create reach its kernel, also when the sandbox was started warm', async () => {
  // The first create of the template makes its warm pool; the later ones
  // may claim a sandbox whose kernel started before its envs were set.
  for (let i = 0; i < 3; i++) {
    const s = await Sandbox.create({ envs: { FROM_CREATE: `v${i}` } })
    try {
      expect((await s.runCode('import os; os.environ["FROM_CREATE"]')).text).toBe(`v${i}`)
      expect((await s.runCode('echo $FROM_CREATE', { language: 'bash' })).logs.stdout.join('')).toBe(`v${i}\n`)
    } finally {
      await s.kill()
    }
    await new Promise((r) => setTimeout(r, 3000)) // time for the pool to refill
  }
}, 120_000)

test('once the start snapshot is taken, a sandbox is restored with its kernel already running', async () => {
  // The server snapshots code-interpreter-v1 in the background after its
  // start (template.Builder.SnapshotBuiltin); until then creates boot it.
  const { dataDir } = inject('warren')
  const file = path.join(dataDir, 'templates', 'code-interpreter-v1.json')
  const deadline = Date.now() + 150_000
  let tmpl = JSON.parse(readFileSync(file, 'utf8'))
  while (!tmpl.snapshot && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 1000))
    tmpl = JSON.parse(readFileSync(file, 'utf8'))
  }
  expect(tmpl.snapshot, 'the server recorded no start snapshot').toMatch(/^snap-/)
  expect(tmpl.layers.at(-1)).toBe(tmpl.snapshot)
  const createdAfter = Date.now() / 1000
  // envd marks the default kernel ready when its bridge says so; in a
  // restored sandbox that happened before the snapshot, so before the
  // create, and the kernel is the snapshot's process (gVisor keeps pids).
  const probe = 'import os; f"{os.getpid()} {os.stat(\'/run/warren-codeinterp/default-kernel-ready\').st_mtime}"'
  const seen = []
  for (let i = 0; i < 2; i++) {
    const s = await Sandbox.create({ envs: { RESTORED: `r${i}` } })
    try {
      const [pid, readyAt] = (await s.runCode(probe)).text.replace(/'/g, '').split(' ')
      seen.push({ pid, readyAt: Number(readyAt) })
      expect((await s.runCode('import os; os.environ["RESTORED"]')).text).toBe(`r${i}`)
    } finally {
      await s.kill()
    }
  }
  for (const { readyAt } of seen) expect(readyAt).toBeLessThan(createdAfter)
  expect(seen[1].pid).toBe(seen[0].pid)
}, 240_000)

test('JavaScript cells keep their state and give values and exceptions', async () => {
  const first = await sbx.runCode('const n = 40\nconsole.log("from node", process.version.startsWith("v"))\nn + 2', { language: 'js' })
  expect(first.text).toBe('42')
  expect(first.logs.stdout.join('')).toBe('from node true\n')
  expect((await sbx.runCode('n * 2', { language: 'javascript' })).text).toBe('80')
  const failing = await sbx.runCode('null.x', { language: 'js' })
  expect(failing.error.name).toBe('TypeError')
  const ctx = await sbx.createCodeContext({ language: 'js', cwd: '/tmp' })
  expect(ctx.language).toBe('javascript')
  expect((await sbx.runCode('process.cwd()', { context: ctx })).text).toBe('/tmp')
  await sbx.removeCodeContext(ctx)
})
