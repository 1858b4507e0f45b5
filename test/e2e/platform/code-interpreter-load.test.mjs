// Ten code-interpreter sandboxes created at once, each running cells at
// the same time: state across two cells and a small pandas operation,
// each sandbox with its own numbers, all correct. Bounded in time (this
// machine may have two cores): every call has its timeoutMs.
import { expect, test } from 'vitest'
import { Sandbox } from '@e2b/code-interpreter'

test('10 sandboxes created at once run cells at once, each with its own state', async () => {
  const n = 10
  const sbxs = await Promise.all(Array.from({ length: n }, () => Sandbox.create({ timeoutMs: 300_000 })))
  try {
    expect(new Set(sbxs.map((s) => s.sandboxId)).size).toBe(n)
    const results = await Promise.all(sbxs.map(async (s, i) => {
      const first = await s.runCode(`import pandas as pd\ndf = pd.DataFrame({"k": [${i}, ${i}, ${i + 1}], "v": [1, 2, ${10 * i}]})\nlen(df)`, { timeoutMs: 180_000 })
      const second = await s.runCode('g = df.groupby("k")["v"].sum()\n[int(x) for x in g.values]', { timeoutMs: 180_000 })
      return { first: first.text, second: second.text, errors: [first.error, second.error].filter(Boolean) }
    }))
    results.forEach((r, i) => {
      expect(r.errors, `sandbox ${i}`).toEqual([])
      expect(r.first).toBe('3')
      expect(r.second).toBe(`[3, ${10 * i}]`)
    })
  } finally {
    await Promise.all(sbxs.map((s) => s.kill().catch(() => {})))
  }
}, 300_000)
