// startCluster runs a Warren cluster on this machine: a PostgreSQL
// database of its own, `--role node` processes (each with its own data
// dir, network prefix, address range, run dir, cgroup and port) and
// `--role api` processes, all with one cluster secret, one preset API key
// and one volume root (plain directories, as on a file server they all
// mount). For the cluster test and the cluster benchmark.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { freePort, newDataDir, spawnWarren, unmountBelow, warrenBinary } from './start-warren.mjs'

export const psql = (sql, dbname = 'postgres', host = '/var/run/postgresql', user = 'root') =>
  execFileSync('psql', ['-h', host, '-U', user, '-d', dbname, '-v', 'ON_ERROR_STOP=1', '-tAc', sql], { encoding: 'utf8' }).trim()

// nodes: { name: { prefix, net16 } }; apis: how many api processes;
// nodeArgs: more flags for every node; apiArgs[i]: for api process i
// (each of its starts); extraArgs: for every process;
// pg: a PostgreSQL server of the caller's own ({ host, user }: its
// socket dir and role), default the shared one.
export async function startCluster({ nodes, apis = 1, poolSize = 1, nodeArgs = [], apiArgs = [], extraArgs = [], pg = { host: '/var/run/postgresql', user: 'root' } }) {
  const sql = (q, dbname = 'postgres') => psql(q, dbname, pg.host, pg.user)
  const secret = randomBytes(32).toString('hex')
  const apiKey = 'e2b_' + randomBytes(20).toString('hex')
  const db = `warren_e2e_cluster_${process.pid}_${randomBytes(3).toString('hex')}`
  const storeURL = `postgres:///${db}?host=${pg.host}&user=${pg.user}&sslmode=disable`
  const env = { ...process.env, WARREN_CLUSTER_SECRET: secret, WARREN_API_KEY: apiKey }
  delete env.WARREN_ACCESS_TOKEN
  sql(`CREATE DATABASE ${db}`)
  const volumeRoot = mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-volumes-'))
  const shared = ['--volume-root', volumeRoot, '--volume-quota', '0', '--log-format', 'text', ...extraArgs]

  const c = {
    storeURL,
    apiKey,
    nodes: Object.fromEntries(Object.entries(nodes).map(([name, n]) => [name, { ...n }])),
    apis: Array.from({ length: apis }, () => ({})),
    // startNode starts (or restarts, same data dir and port) a node;
    // extraEnv adds to its environment (the chaos run's clock skew).
    async startNode(name, extraEnv = {}) {
      const n = c.nodes[name]
      n.port ??= await freePort()
      n.metricsPort ??= await freePort()
      n.dataDir ??= newDataDir()
      n.proc = await spawnWarren([
        'serve', '--role', 'node', '--store', storeURL, '--data-dir', n.dataDir,
        '--node-name', name, '--node-addr', `127.0.0.1:${n.port}`, '--node-label', `zone=${name}`,
        '--metrics-addr', `127.0.0.1:${n.metricsPort}`,
        '--network-prefix', n.prefix, '--network-cidr', `10.${n.net16}.0.0/16`,
        '--run-dir', `/run/warren-${n.prefix}`, '--cgroup-parent', `/warren-${n.prefix}`,
        '--pool-size', String(poolSize), ...shared, ...nodeArgs,
      ], { env: { ...env, ...extraEnv }, healthUrl: `http://127.0.0.1:${n.port}/health` })
    },
    // startAPI starts (or restarts, same ports) api process i, with
    // extra flags for this start; its opts are the SDK's connection
    // options.
    async startAPI(i, extra = []) {
      const a = c.apis[i]
      a.port ??= await freePort()
      a.proxyPort ??= await freePort()
      a.metricsPort ??= await freePort()
      a.dataDir ??= mkdtempSync(path.join(os.tmpdir(), 'warren-e2e-api-'))
      // At debug level an api logs each create's candidates and where
      // it placed it, which a failed cluster test prints.
      a.proc = await spawnWarren([
        'serve', '--role', 'api', '--store', storeURL, '--data-dir', a.dataDir,
        '--api-addr', `127.0.0.1:${a.port}`, '--proxy-addr', `127.0.0.1:${a.proxyPort}`,
        '--metrics-addr', `127.0.0.1:${a.metricsPort}`, '--log-level', 'debug', ...shared, ...(apiArgs[i] || []), ...extra,
      ], { env, healthUrl: `http://127.0.0.1:${a.port}/health` })
      a.opts = { apiUrl: `http://127.0.0.1:${a.port}`, sandboxUrl: `http://127.0.0.1:${a.proxyPort}`, apiKey }
    },
    nodesTable: () => execFileSync(warrenBinary, ['nodes', '--store', storeURL], { encoding: 'utf8' }),
    warrenNodes: (...args) => execFileSync(warrenBinary, ['nodes', ...args, '--store', storeURL], { encoding: 'utf8' }),
    // nodeRow is a node's line of `warren nodes` as [NAME, STATE, SANDBOXES, ...].
    nodeRow: (name) => c.nodesTable().trim().split('\n').slice(1).map((l) => l.split(/\s+/)).find((f) => f[0] === name),
    // nodeOf is the node the store places sandbox id on.
    nodeOf: (id) => sql(`SELECT node FROM sandboxes WHERE id = '${id.replace(/[^a-z0-9]/g, '')}'`, db),
    // sql runs a query on the cluster's database.
    sql: (q) => sql(q, db),
    // stop kills every sandbox (a node that was killed comes back first,
    // to adopt its sandboxes), stops every process, and removes the
    // data dirs and the database.
    async stop() {
      for (const name of Object.keys(c.nodes)) {
        if (c.nodes[name].proc?.exited()) await c.startNode(name).catch(() => {})
      }
      const a = c.apis.find((a) => a.proc && !a.proc.exited())
      if (a) {
        const headers = { 'X-API-Key': apiKey }
        const res = await fetch(`${a.opts.apiUrl}/v2/sandboxes?limit=100`, { headers }).catch(() => null)
        for (const sb of res?.ok ? await res.json() : []) {
          await fetch(`${a.opts.apiUrl}/sandboxes/${sb.sandboxID}`, { method: 'DELETE', headers }).catch(() => {})
        }
      }
      for (const p of [...c.apis, ...Object.values(c.nodes)]) await p.proc?.stop()
      for (const n of Object.values(c.nodes)) {
        if (!n.dataDir) continue
        unmountBelow(n.dataDir)
        rmSync(n.dataDir, { recursive: true, force: true })
      }
      for (const a of c.apis) if (a.dataDir) rmSync(a.dataDir, { recursive: true, force: true })
      unmountBelow(volumeRoot)
      rmSync(volumeRoot, { recursive: true, force: true })
      sql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`)
    },
  }
  try {
    await Promise.all(Object.keys(c.nodes).map((name) => c.startNode(name)))
    for (let i = 0; i < apis; i++) await c.startAPI(i)
  } catch (e) {
    await c.stop().catch(() => {})
    throw e
  }
  return c
}
