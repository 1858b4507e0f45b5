// A short chaos run (test/e2e/chaos/chaos.mjs; make chaos runs the long
// one): a cluster of its own (PostgreSQL, two apis, two nodes) under the
// SDK's mixed load while a node is killed with -9 and restarted and
// PostgreSQL is stopped immediately and restarted; the invariants hold
// after each and at the end, and nothing leaks.
import { expect, test } from 'vitest'
import { report, runChaos } from '../chaos/chaos.mjs'

test('chaos: kill -9 of a node and of PostgreSQL under load: no invariant violated, nothing leaked', async () => {
  const lines = []
  const out = await runChaos({ durationS: 22, everyS: 10, schedule: ['kill-node', 'kill-postgres'], workers: 2, maxLive: 4, log: (l) => lines.push(l) })
  const violations = report(out, (l) => lines.push(l))
  if (violations) console.error(lines.join('\n'))
  expect(out.results.length).toBeGreaterThan(5)
  expect(out.results.filter((r) => !r.ok)).toEqual([])
}, 180_000)
