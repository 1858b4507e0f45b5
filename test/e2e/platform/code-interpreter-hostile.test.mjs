// Hostile cells against the code interpreter: each may only hurt its own
// kernel, never the server on port 49999 or the sandbox.
import { afterAll, beforeAll, expect, inject, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

let sbx
const s = () => sbx

// executeRaw posts a cell to /execute through the proxy, as the SDK does,
// and reads its stream without keeping it: every line must parse as JSON.
// It returns the number of lines and stdout bytes, the event types seen
// (with their counts) and the last event.
async function executeRaw(s, body, timeoutMs) {
  const { sandboxUrl } = inject('warren')
  const res = await fetch(`${sandboxUrl}/execute`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json', 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '49999',
      ...(s.envdAccessToken ? { 'X-Access-Token': s.envdAccessToken } : {}),
    },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  })
  expect(res.status).toBe(200)
  const decoder = new TextDecoder()
  let pending = ''
  const out = { lines: 0, stdoutBytes: 0, types: {}, last: null, notes: [] }
  const take = (line) => {
    const ev = JSON.parse(line) // throws on a line that is not JSON
    out.lines++
    out.types[ev.type] = (out.types[ev.type] ?? 0) + 1
    if (ev.type === 'stdout') out.stdoutBytes += Buffer.byteLength(ev.text)
    if (ev.type === 'stderr' && ev.text.startsWith('[warren')) out.notes.push(ev.text)
    out.last = ev
  }
  for await (const chunk of res.body) {
    pending += decoder.decode(chunk, { stream: true })
    let i
    while ((i = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, i)
      pending = pending.slice(i + 1)
      if (line) take(line)
    }
  }
  expect(pending, 'the stream ends with a whole line').toBe('')
  return out
}

// envdRSS reads envd's resident memory (kB) from /proc of the sandbox
// (gVisor's /proc has no VmHWM: a peak is sampled).
async function envdRSS(s) {
  const r = await s.commands.run('for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = envd ] && grep ^VmRSS $p/status; done; true')
  return Number(/VmRSS:\s+(\d+)/.exec(r.stdout)?.[1])
}

// whileSampling runs fn and samples envd's RSS every 200 ms meanwhile;
// it returns fn's value and the highest sample.
async function whileSampling(s, fn) {
  let peak = 0
  let running = true
  const sampler = (async () => {
    while (running) {
      peak = Math.max(peak, await envdRSS(s).catch(() => 0))
      await new Promise((r) => setTimeout(r, 200))
    }
  })()
  try {
    return { value: await fn(), peak }
  } finally {
    running = false
    await sampler
  }
}

beforeAll(async () => {
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
}, 120_000)

afterAll(async () => {
  await sbx?.kill()
})

test('a cell that allocates without bound loses its kernel, not the server', async () => {
  await sbx.runCode('before = 1')
  const ex = await sbx.runCode('hog = []\nwhile True:\n    hog.append(bytearray(64 * 2**20))', { timeoutMs: 120_000 })
  expect(ex.error, 'the cell ends with an error').toBeDefined()
  expect(['MemoryError', 'KernelDied']).toContain(ex.error.name)
  expect((await sbx.runCode('1 + 1')).text).toBe('2')
  expect((await sbx.commands.run('echo alive')).stdout).toBe('alive\n')
}, 180_000)

test('a cell cannot kill the server: it runs as root, cells as user', async () => {
  // envd (which serves port 49999 in-process) by its pid, not assumed.
  const found = await sbx.runCode('import os\n[int(p) for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/comm").read().strip() == "envd"]')
  const pids = JSON.parse(found.text)
  expect(pids.length, 'envd runs in the sandbox').toBeGreaterThan(0)
  const envd = pids[0]
  const ex = await sbx.runCode(`import os, signal\nos.kill(${envd}, signal.SIGKILL)`)
  expect(ex.error.name).toBe('PermissionError')
  const bash = await sbx.runCode(`kill -9 ${envd}`, { language: 'bash' })
  expect(bash.error?.value).toMatch(/exit status [1-9]/)
  expect(bash.logs.stderr.join('')).toMatch(/not permitted/i)
  expect((await sbx.runCode('"still serving"')).text).toBe('still serving')

  // kill -9 -1: every process of the user, the cell's own shell and
  // every kernel among them. The cell dies with its shell; the server
  // answers and each context gets a new kernel.
  await sbx.runCode('before_kill = 1')
  const all = await sbx.runCode('kill -9 -1; sleep 5', { language: 'bash', timeoutMs: 60_000 })
  // The bridge dies with the rest (it runs as user too).
  expect(['KernelDied', 'UnexpectedEndOfExecution']).toContain(all.error?.name)
  expect((await sbx.runCode('echo after', { language: 'bash' })).logs.stdout.join('')).toBe('after\n')
  const py = await sbx.runCode('"before_kill" in dir(), 6 * 7', { timeoutMs: 60_000 })
  expect(py.text).toBe('(False, 42)')
  expect((await sbx.commands.run('echo envd-alive')).stdout).toBe('envd-alive\n')
}, 180_000)

test('a huge result is dropped with a note; big output streams as valid JSON lines', async () => {
  // One result over the server's 32 MiB bound for a single output.
  const big = await sbx.runCode('"x" * (40 * 2**20)', { timeoutMs: 120_000 })
  expect(big.text).toBeUndefined()
  expect(big.logs.stderr.join('')).toContain('larger than')
  // 10 MB of lines arrive whole (each line is parsed as JSON by the SDK).
  let bytes = 0
  const ex = await sbx.runCode('import sys\nfor i in range(10_000):\n    sys.stdout.write("y" * 999 + "\\n")', {
    onStdout: (m) => { bytes += m.line.length },
    timeoutMs: 120_000,
  })
  expect(ex.error).toBeUndefined()
  expect(bytes).toBe(10_000_000)
  expect((await sbx.runCode('3 * 3')).text).toBe('9')
}, 180_000)

test('cwd: relative paths are refused, dot-dot is cleaned, a directory the user cannot enter fails', async () => {
  await expect(sbx.createCodeContext({ cwd: '../../etc' })).rejects.toThrow(/400/)
  const cleaned = await sbx.createCodeContext({ cwd: '/etc/../tmp' })
  expect(cleaned.cwd).toBe('/tmp')
  expect((await sbx.runCode('import os; os.getcwd()', { context: cleaned })).text).toBe('/tmp')
  await sbx.removeCodeContext(cleaned)
  await expect(sbx.createCodeContext({ cwd: '/root' })).rejects.toThrow(/500/)
  await expect(sbx.createCodeContext({ cwd: '/no/such/dir' })).rejects.toThrow(/500/)
})

// 100 MB printed by a cell: the server passes on at most its bound
// (64 MiB by default) and drops the rest with one note, the stream stays
// valid JSON lines ending in end_of_execution, envd does not hold the
// output, and the next cell of the same context answers.
test.each([
  ['python', 'import sys\nline = "x" * 999 + "\\n"\nfor i in range(100_000):\n    sys.stdout.write(line)'],
  ['python', 'for i in range(100_000):\n    print("p" * 999)'],
  ['bash', 'yes "$(head -c 999 /dev/zero | tr "\\0" b)" | head -n 100000'],
])('100 MB of stdout from a %s cell is bounded and the stream stays valid', async (language, code) => {
  const before = await envdRSS(s())
  const { value: out, peak } = await whileSampling(s(), () => executeRaw(s(), { code, language }, 240_000))
  console.log(`${language}: ${out.lines} lines, ${out.stdoutBytes} stdout bytes; envd VmRSS ${before} kB before, ${peak} kB at the highest sample`)
  expect(out.last).toEqual({ type: 'end_of_execution' })
  expect(out.types.error, 'no error').toBeUndefined()
  expect(out.stdoutBytes).toBeGreaterThan(32 << 20)
  expect(out.stdoutBytes).toBeLessThanOrEqual(64 << 20)
  expect(out.notes).toHaveLength(1)
  expect(out.notes[0]).toMatch(/output passed \d+ bytes/)
  // envd streams: its memory grows by far less than the output.
  expect(peak - before).toBeLessThan(24 * 1024)
  // The next cell of the same context, through the SDK.
  const next = await s().runCode(language === 'bash' ? 'echo next' : '"next"', { language, timeoutMs: 30_000 })
  expect(language === 'bash' ? next.logs.stdout.join('') : next.text).toMatch(/^next\n?$/)
}, 300_000)

test('100 MB of stdout through the SDK: its callbacks get the bound, then the note', async () => {
  let bytes = 0
  let biggest = 0
  const ex = await sbx.runCode('for i in range(100_000):\n    print("s" * 999)', {
    onStdout: (m) => { bytes += m.line.length; biggest = Math.max(biggest, m.line.length) },
    timeoutMs: 240_000,
  })
  expect(ex.error).toBeUndefined()
  expect(bytes).toBeGreaterThan(32 << 20)
  expect(bytes).toBeLessThanOrEqual(64 << 20)
  // Small events, not the megabytes ipykernel sends at once.
  expect(biggest).toBeLessThanOrEqual(64 << 10)
  expect(ex.logs.stderr.join('')).toMatch(/output passed \d+ bytes; the rest is dropped/)
  expect((await sbx.runCode('"after"', { timeoutMs: 30_000 })).text).toBe('after')
}, 300_000)

