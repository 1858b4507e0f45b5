// A short chaos run (test/e2e/chaos/chaos.mjs; make chaos runs the long
// one): a cluster of its own (PostgreSQL, two apis, two nodes) under the
// SDK's mixed load while PostgreSQL is stopped immediately (pg_ctl stop
// -m immediate) and restarted; the invariants hold after it and at the
// end, and nothing leaks. (cluster.test.mjs kills a node.)
import { expect, test } from 'vitest'
import { report, runChaos } from '../chaos/chaos.mjs'

test('chaos: PostgreSQL killed under load: no invariant violated, nothing leaked', async () => {
  const lines = []
  const out = await runChaos({ durationS: 10, everyS: 5, schedule: ['kill-postgres'], workers: 2, maxLive: 4, log: (l) => lines.push(l) })
  const violations = report(out, (l) => lines.push(l))
  if (violations) console.error(lines.join('\n'))
  expect(out.results.length).toBeGreaterThan(5)
  expect(out.results.filter((r) => !r.ok)).toEqual([])
}, 180_000)
