// Shared helpers: temporary directories, and a holder in another real
// process of the same runtime, driven by handshakes with bounded waits.
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const STEP = 10_000;
export const here = path.dirname(fileURLToPath(import.meta.url));
export const isBun = Boolean(process.versions.bun);

// Every directory a test made goes when its process exits, so a run
// leaves /tmp as it found it. A lease held until exit (the garbage
// collection test) is still watched then, and its holder would put the
// file back between the removal's unlink and rmdir: the directory is moved
// aside first, so the holder looks for its path where nothing is.
const made = [];
process.on('exit', () => {
  for (const d of made) {
    try {
      fs.renameSync(d, `${d}.gone`);
      fs.rmSync(`${d}.gone`, { recursive: true, force: true, maxRetries: 5, retryDelay: 1 });
    } catch (e) {
      process.stderr.write(`could not remove the test directory ${d}: ${e.message}\n`);
    }
  }
});

export function tmpdir() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'sidelease-js-'));
  made.push(d);
  return d;
}

export function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// [command, args] that run this runtime (Node or Bun) on ARGS. Under an
// emulator (tests/cross-targets runs Bun's arm64 build under
// qemu-aarch64-static, where nothing makes the kernel run an arm64 program
// by itself) SIDELEASE_TEST_EMULATOR names it, and children go through it.
export function self(args) {
  const emulator = (process.env.SIDELEASE_TEST_EMULATOR || '').split(' ').filter(Boolean);
  return emulator.length ? [emulator[0], [...emulator.slice(1), process.execPath, ...args]] : [process.execPath, args];
}

export class Holder {
  static async start(target) {
    const h = new Holder();
    h.proc = spawn(...self([path.join(here, 'fixtures', 'holder.cjs'), target]), {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    h.lines = [];
    h.waiters = [];
    let buf = '';
    h.proc.stdout.setEncoding('utf8');
    h.proc.stdout.on('data', (chunk) => {
      buf += chunk;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const msg = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        const w = h.waiters.shift();
        if (w) w(msg);
        else h.lines.push(msg);
      }
    });
    const ready = await h.next('ready');
    h.pid = ready.pid;
    h.record = ready.record;
    return h;
  }

  next(what) {
    const p = this.lines.length ? Promise.resolve(this.lines.shift()) : new Promise((r) => this.waiters.push(r));
    return withTimeout(p, STEP, `holder ${what}`);
  }

  /** Let go about `ms` after this resolves (the holder has the request by then). */
  async releaseSoon(ms) {
    this.proc.stdin.write(`release-in ${ms}\n`);
    const msg = await this.next('scheduled');
    if (msg.event !== 'scheduled') throw new Error(`unexpected ${JSON.stringify(msg)}`);
  }

  async release() {
    this.proc.stdin.write('release\n');
    const msg = await this.next('released');
    if (msg.event !== 'released') throw new Error(`unexpected ${JSON.stringify(msg)}`);
  }

  async kill(signal = 'SIGKILL') {
    const exited = new Promise((r) => this.proc.once('exit', r));
    process.kill(this.proc.pid, signal);
    await withTimeout(exited, STEP, 'holder exit');
  }

  close() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
    this.proc.stdin.destroy();
    this.proc.stdout.destroy();
  }
}

/** A PostgreSQL lease URL of its own on the cluster tests/run starts. */
export function pgUrl() {
  const base = process.env.SIDELEASE_TEST_PG;
  if (!base) throw new Error('SIDELEASE_TEST_PG is not set: eval "$(bash tests/pg/cluster start)" (tests/run does)');
  return `${base}?lease=js-${crypto.randomBytes(6).toString('hex')}`;
}

/** One statement as the superuser, its output. */
export function psql(sql) {
  const e = process.env;
  let cmd = path.join(e.SIDELEASE_TEST_PG_BIN, 'psql');
  let args = ['-X', '-q', '-t', '-A', '-v', 'ON_ERROR_STOP=1', '-h', e.SIDELEASE_TEST_PG_DIR, '-p', e.SIDELEASE_TEST_PG_PORT,
    '-U', 'postgres', '-d', 'app', '-c', sql];
  if (process.getuid() === 0) {
    args = ['-u', 'postgres', '--', cmd, ...args];
    cmd = 'runuser';
  }
  return execFileSync(cmd, args, { encoding: 'utf8' }).trim();
}

/** The lease name of a PostgreSQL lease URL. */
export function leaseName(url) {
  return url.split('lease=').pop().split('&')[0];
}

/** SQL for the backend PIDs holding the lease `url`'s advisory lock,
 * whichever session carries it (the process's shared one or its own): the
 * key as the library computes it, from the name. */
export function holderBackends(url) {
  const name = leaseName(url).replaceAll("'", "''");
  const key = `('x' || left(encode(sha256('\\x736964656c65617365206c6561736500'::bytea || `
    + `convert_to('${name}', 'UTF8')), 'hex'), 16))::bit(64)::bigint`;
  return `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
    AND classid = ((${key} >> 32) & 4294967295)::oid AND objid = (${key} & 4294967295)::oid`;
}

/** pg_terminate_backend of the session holding the lease `url`: how many. */
export function terminateHolder(url) {
  return Number(psql(`SELECT count(pg_terminate_backend(pid)) FROM (${holderBackends(url)}) h`));
}
