// The Bun server example, run by real Bun.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '..', '..');
const BUN = path.join(root, 'bindings-node', 'node_modules', '@oven', 'bun-linux-x64', 'bin', 'bun');
const env = (db) => ({ ...process.env, APP_DB: db, SIDELEASE_MODULE: path.join(root, 'bindings-node', 'index.js') });

function start(db) {
  const proc = spawn(BUN, [path.join(here, 'server.js')], { env: env(db), stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  proc.stdout.on('data', (c) => (out += c));
  proc.stderr.on('data', (c) => (err += c));
  const exited = new Promise((r) => proc.once('exit', (code) => r(code)));
  const port = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port; stderr: ${err}`)), 10_000);
    proc.stdout.on('data', () => {
      const m = out.match(/listening on (\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    exited.then((code) => { clearTimeout(timer); reject(new Error(`exited ${code}: ${err}`)); });
  });
  port.catch(() => {});
  return { proc, port, exited, stderr: () => err };
}

test('one Bun server per database; the second names the first', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sidelease-bun-'));
  const db = path.join(dir, 'app.db');
  const a = start(db);
  try {
    const port = await a.port;
    const health = await (await fetch(`http://127.0.0.1:${port}/`)).json();
    assert.equal(health.pid, a.proc.pid);
    assert.equal(health.lease, 'held');
    const b = start(db);
    assert.equal(await b.exited, 75);
    assert.match(b.stderr(), new RegExp(`is leased by pid ${a.proc.pid} \\(bun `));
    a.proc.kill('SIGTERM');
    assert.equal(await a.exited, 0);
    const c = start(db);
    await c.port;
    const h2 = await (await fetch(`http://127.0.0.1:${await c.port}/`)).json();
    assert.equal(h2.previousReleasedCleanly, true);
    assert.equal(h2.generation, health.generation + 1);
    c.proc.kill('SIGTERM');
    await c.exited;
  } finally {
    if (a.proc.exitCode === null) a.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
