// A short chaos run (test/e2e/chaos/chaos.mjs; make chaos runs the long
// one): a cluster of its own (PostgreSQL, two apis, two nodes) under the
// SDK's mixed load while a sandbox's runsc process is killed from the
// host (the node's reconciler must make the store agree) and PostgreSQL
// is stopped immediately (pg_ctl stop -m immediate) and restarted; the
// invariants hold after each and at the end, and nothing leaks.
// (cluster.test.mjs kills a node.)
import { expect, test } from 'vitest'
import { report, runChaos } from '../chaos/chaos.mjs'

test('chaos: a runsc process and PostgreSQL killed under load: no invariant violated, nothing leaked', async () => {
  const lines = []
  const out = await runChaos({ durationS: 22, everyS: 5, schedule: ['kill-runsc', 'kill-postgres'], workers: 2, maxLive: 4, log: (l) => lines.push(l) })
  const violations = report(out, (l) => lines.push(l))
  if (violations) console.error(lines.join('\n'))
  expect(out.results.length).toBeGreaterThan(5)
  expect(out.results.filter((r) => !r.ok)).toEqual([])
}, 180_000)
