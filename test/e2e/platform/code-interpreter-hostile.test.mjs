// Hostile cells against the code interpreter: each may only hurt its own
// kernel, never the server on port 49999 or the sandbox.
import { afterAll, beforeAll, expect, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

let sbx

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
  const ex = await sbx.runCode('import os, signal\nos.kill(1, signal.SIGKILL)')
  expect(ex.error.name).toBe('PermissionError')
  expect((await sbx.runCode('"still serving"')).text).toBe('still serving')
})

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
