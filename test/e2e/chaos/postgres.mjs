// A PostgreSQL server of the chaos run's own (never the shared one the
// other tests use: the chaos run kills it): initdb into a temporary
// directory as the postgres user, listening only on a Unix socket there.
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

function pgBin() {
  const root = '/usr/lib/postgresql'
  const versions = existsSync(root) ? readdirSync(root).sort((a, b) => Number(a) - Number(b)) : []
  if (!versions.length) throw new Error('PostgreSQL is not installed (scripts/install-deps.sh)')
  return path.join(root, versions[versions.length - 1], 'bin')
}

export function startPostgres() {
  const bin = pgBin()
  const dir = mkdtempSync(path.join(os.tmpdir(), 'warren-chaos-pg-'))
  chmodSync(dir, 0o755)
  // Who owns it: scripts/sweep-test-leftovers.sh stops and removes the
  // server of a run that was killed (its owner gone).
  writeFileSync(path.join(dir, 'owner'), ownerRecord())
  execFileSync('chown', ['postgres:', dir])
  const data = path.join(dir, 'data')
  const asPG = (cmd, args, opts = {}) => execFileSync('runuser', ['-u', 'postgres', '--', path.join(bin, cmd), ...args], { encoding: 'utf8', ...opts })
  asPG('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync'])
  const pg = {
    dir,
    host: dir,
    // start (again): WAL recovery after an immediate stop is part of it.
    start() {
      asPG('pg_ctl', ['-D', data, '-o', `-c listen_addresses='' -k ${dir} -c max_connections=200`, '-l', path.join(dir, 'log'), '-w', '-t', '60', 'start'], { stdio: 'ignore' })
    },
    // crash: pg_ctl stop -m immediate, as a power cut to the server
    // (no checkpoint; the next start replays the WAL).
    crash() {
      asPG('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop'], { stdio: 'ignore' })
    },
    psql(sql, dbname = 'postgres') {
      return execFileSync('psql', ['-h', dir, '-U', 'postgres', '-d', dbname, '-v', 'ON_ERROR_STOP=1', '-tAc', sql], { encoding: 'utf8' }).trim()
    },
    stop() {
      try { asPG('pg_ctl', ['-D', data, '-m', 'fast', '-w', 'stop'], { stdio: 'ignore' }) } catch {}
      rmSync(dir, { recursive: true, force: true })
    },
  }
  pg.start()
  return pg
}

// ownerRecord is "pid starttime" of this process (starttime: field 22 of
// /proc/self/stat), which tells it from a later process given its pid.
export function ownerRecord() {
  const stat = readFileSync('/proc/self/stat', 'utf8')
  const f = stat.slice(stat.lastIndexOf(')') + 1).trim().split(/\s+/)
  return `${process.pid} ${f[19]}\n`
}
