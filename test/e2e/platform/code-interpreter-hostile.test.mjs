// Hostile cells against the code interpreter: each may only hurt its own
// kernel, never the server on port 49999 or the sandbox.
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { afterAll, beforeAll, expect, inject, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

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

// pidsCgroup is the host pids cgroup of sandbox id (the test server's
// cgroup parent is /warren-e2e: setup/start-warren.mjs).
function pidsCgroup(id) {
  for (const parent of ['/sys/fs/cgroup/pids/warren-e2e', '/sys/fs/cgroup/warren-e2e']) {
    if (!existsSync(parent)) continue
    const name = readdirSync(parent).find((n) => n.includes(id))
    if (name) return `${parent}/${name}`
  }
  throw new Error(`no pids cgroup of sandbox ${id}`)
}
const readNumber = (file) => Number(readFileSync(file, 'utf8').trim())
// guestProcesses counts the processes in sandbox s, as root.
const guestProcesses = async (s) => Number((await s.commands.run('ls -d /proc/[0-9]* | wc -l', { user: 'root', timeoutMs: 30_000 })).stdout.trim())
// hostTasks is the number of tasks (threads) on the host.
const hostTasks = () => Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3].split('/')[1])

// A fork bomb in a cell: the sandbox's pids limit holds it (the host's
// task count grows by no more than the limit), another sandbox's cells
// run meanwhile, and restarting the bomb's context (its process group)
// ends it; the server answers throughout.
//
// A Python bomb (os.fork of the kernel) is not survived yet: each fork
// costs the guest ~47 MiB under runsc, the sandbox's memory is gone in
// ~2 s, before envd's memory guard gets the CPU, and the host's OOM
// killer ends the sandbox. The test after this one holds it to what does
// hold: the bomb stays in its sandbox.
test.each([
  ['bash', ':(){ :|:& };:'],
])('a %s fork bomb stays in its sandbox; restarting its context ends it', async (language, code) => {
  const bomb = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const cg = pidsCgroup(bomb.sandboxId)
    const limit = readNumber(`${cg}/pids.max`)
    const idle = readNumber(`${cg}/pids.current`)
    const hostBefore = hostTasks()
    const guestIdle = await guestProcesses(bomb)
    const ctx = await bomb.createCodeContext({ language })
    // The bash cell returns at once (its bomb goes on in the
    // background); the Python one runs until its timeoutMs interrupts it,
    // its children going on.
    const cell = bomb.runCode(code, { context: ctx, timeoutMs: 10_000 }).catch((e) => e)
    let peak = 0
    let hostPeak = 0
    for (const end = Date.now() + 12_000; Date.now() < end; await sleep(100)) {
      peak = Math.max(peak, readNumber(`${cg}/pids.current`))
      hostPeak = Math.max(hostPeak, hostTasks())
    }
    await cell
    console.log(`${language} fork bomb: sandbox tasks ${idle} idle, ${peak} at the peak (limit ${limit}); host tasks ${hostBefore} before, ${hostPeak} at the peak`)
    expect(peak, 'the bomb ran').toBeGreaterThan(idle + 100)
    expect(peak).toBeLessThanOrEqual(limit)
    // Other agents share this machine: 1000 tasks of slack for them.
    expect(hostPeak - hostBefore).toBeLessThan(limit + 1000)
    // Another sandbox runs cells meanwhile.
    expect((await sbx.runCode('"elsewhere"', { timeoutMs: 60_000 })).text).toBe('elsewhere')

    // The bomb's code interpreter answers: restarting the context kills
    // its process group, bomb and all. Counted inside the sandbox: under
    // runsc (systrap) the host tasks of exited guest processes stay with
    // the sentry for reuse (measured: 1112 host tasks 16 s after the
    // restart, 6 guest processes), bounded by the pids limit above.
    const restarted = Date.now()
    await bomb.restartCodeContext(ctx)
    let now = Infinity
    for (const end = Date.now() + 60_000; Date.now() < end && now > guestIdle + 10; await sleep(250)) {
      now = await guestProcesses(bomb)
    }
    console.log(`${language} fork bomb: ${guestIdle} guest processes idle, ${now} ${Date.now() - restarted} ms after the restart began`)
    expect(now, 'the bomb is gone').toBeLessThanOrEqual(guestIdle + 10)
    const after = await bomb.runCode(language === 'bash' ? 'echo calm' : '"calm"', { context: ctx, timeoutMs: 60_000 })
    expect(language === 'bash' ? after.logs.stdout.join('') : after.text).toMatch(/^calm\n?$/)
    expect((await bomb.runCode('2 + 2', { timeoutMs: 60_000 })).text).toBe('4')
  } finally {
    await bomb.kill()
  }
}, 240_000)

// The Python fork bomb ends its own sandbox (see above) and nothing else:
// the host's tasks stay bounded by the sandbox's pids limit and another
// sandbox's cells run meanwhile and after.
test('a Python fork bomb ends at most its own sandbox', async () => {
  const bomb = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const cg = pidsCgroup(bomb.sandboxId)
    const limit = readNumber(`${cg}/pids.max`)
    const hostBefore = hostTasks()
    const cell = bomb.runCode('import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)', { timeoutMs: 10_000 }).catch((e) => e)
    let hostPeak = 0
    for (const end = Date.now() + 12_000; Date.now() < end; await sleep(100)) {
      hostPeak = Math.max(hostPeak, hostTasks())
    }
    // What the cell ends with is not what this test holds (its kernel
    // or its sandbox dies): it is waited for only briefly. In a full
    // `make test` its stream could stay open until the SDK's 60 s
    // request timeout (the test took 60.1 s there, 12 s alone); the kill
    // below ends it.
    const ended = await Promise.race([cell.then((r) => (r instanceof Error ? `failed (${r.name})` : `ended${r?.error ? ` (${r.error.name})` : ''}`)), sleep(2000).then(() => 'still open')])
    console.log(`python fork bomb: host tasks ${hostBefore} before, ${hostPeak} at the peak (sandbox pids limit ${limit}); its cell: ${ended}`)
    // Other agents share this machine: 1000 tasks of slack for them.
    expect(hostPeak - hostBefore).toBeLessThan(limit + 1000)
    expect((await sbx.runCode('"elsewhere"', { timeoutMs: 60_000 })).text).toBe('elsewhere')
  } finally {
    await bomb.kill().catch(() => {})
  }
}, 120_000)
