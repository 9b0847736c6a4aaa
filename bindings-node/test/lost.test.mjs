// The holder's watch from Node and Bun: a deleted lease file is put back;
// a rival process that holds the file now at the lease path makes the lease
// lost (`state`, `lostReason`, `ensureHeld()`, `lease.signal`); watching
// never keeps the event loop alive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

import { Holder, STEP, self, tmpdir, withTimeout } from './helpers.mjs';

const require = createRequire(import.meta.url);
const sidelease = require('../index.js');

async function until(cond, what) {
  const deadline = Date.now() + STEP;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

test('a deleted lease file is put back and the lease stays held', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const lease = sidelease.acquire(db);
  try {
    assert.equal(lease.state, 'held');
    assert.equal(lease.lostReason, null);
    const before = fs.statSync(lease.leasePath).ino;
    fs.unlinkSync(lease.leasePath);
    await until(() => fs.existsSync(lease.leasePath) && fs.statSync(lease.leasePath).ino !== before, 'the re-anchor');
    lease.ensureHeld();
    assert.equal(lease.state, 'held');
    assert.equal(lease.signal.aborted, false);
    assert.equal(sidelease.inspect(db).state, 'held');
  } finally {
    lease.release();
  }
  assert.equal(lease.state, 'released');
});

test('a rival holding the file at the lease path makes the lease lost', async () => {
  const dir = tmpdir();
  const db = path.join(dir, 'app.db');
  const rival = await Holder.start(path.join(dir, 'rival.db'));
  try {
    const lease = sidelease.acquire(db);
    const signal = lease.signal;
    const aborted = new Promise((r) => signal.addEventListener('abort', r, { once: true }));
    const t = Date.now();
    // The rival's locked file takes the lease file's name.
    fs.renameSync(path.join(dir, 'rival.db.backend-lease'), lease.leasePath);
    await withTimeout(aborted, STEP, 'lease.signal');
    assert.ok(Date.now() - t < 500, `signal after ${Date.now() - t} ms`);
    assert.equal(signal.reason.code, 'SIDELEASE_LOST');
    assert.ok(signal.reason instanceof sidelease.SideleaseError);
    assert.equal(lease.state, 'lost');
    assert.match(lease.lostReason, new RegExp(String(rival.pid)));
    assert.throws(() => lease.ensureHeld(), (e) => e.code === 'SIDELEASE_LOST' && e.message.includes(String(rival.pid)));
    lease.release();
    assert.equal(lease.state, 'released');
  } finally {
    rival.close();
  }
});

test('watch: false leaves a deleted lease file alone', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const lease = sidelease.acquire(db, { watch: false });
  try {
    fs.unlinkSync(lease.leasePath);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(fs.existsSync(lease.leasePath), false);
    assert.equal(lease.check(), 'unlinked');
  } finally {
    lease.release();
  }
  assert.throws(() => sidelease.acquire(db, { watch: 'yes' }), TypeError);
});

test('a held lease with its signal watched does not keep the process alive', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const code = `const s = require(${JSON.stringify(require.resolve('../index.js'))});
const lease = s.acquire(${JSON.stringify(db)});
lease.signal.addEventListener('abort', () => {});
lease.onLost(() => {});
globalThis.keep = lease;
console.log('held');`;
  const child = spawn(...self(['-e', code]), { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (c) => { out += c; });
  const exit = await withTimeout(new Promise((r) => child.once('exit', (c, sig) => r({ c, sig }))), STEP,
    'the child to exit on its own');
  assert.deepEqual(exit, { c: 0, sig: null });
  assert.equal(out, 'held\n');
});
