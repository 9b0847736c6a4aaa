// Issue 34 in Node and Bun: a campaign stopped as it wins leaves nothing
// held once stop() resolves (and its work never starts); `signal` and
// `lostReason` answer after release() as they did before it, whichever
// order they are read in; ensureHeld() reporting a loss has aborted the
// signal first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

import { Holder, STEP, tmpdir, withTimeout } from './helpers.mjs';

const require = createRequire(import.meta.url);
const sidelease = require('../index.js');

// Nothing of this process holds the lease file: a lock from a new open
// file description of it would be granted. Asked of the kernel through
// inspect(), whose holders come from the kernel's lock table.
function nothingHeld(db) {
  return sidelease.inspect(db).state !== 'held';
}

test('an elector stopped as it is elected never starts its work and holds nothing once stop() resolves', async () => {
  const db = path.join(tmpdir(), 'app.db');
  for (let i = 0; i < 20; i++) {
    const elector = new sidelease.Elector(db);
    let started = 0;
    // The window: elected, before the term's work begins.
    elector.once('elected', () => elector.stop());
    await withTimeout(elector.run(async () => { started++; }), STEP, 'run()');
    assert.equal(started, 0, 'work started in a stopped elector');
    assert.ok(nothingHeld(db), 'the term won as it was stopped is still held');
  }
});

test('lead() aborted at random moments around the grant holds nothing once it settles (1,000 times)', async () => {
  const db = path.join(tmpdir(), 'app.db');
  let seed = 34;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  let heldAfter = 0;
  for (let i = 0; i < 1000; i++) {
    const ac = new AbortController();
    const done = sidelease.lead(db, (lease, signal) => new Promise((r) => signal.addEventListener('abort', r, { once: true })), { signal: ac.signal });
    // 0-3 turns of the event loop, then the abort.
    let turns = Math.floor(rand() * 4);
    await new Promise((r) => {
      const step = () => (turns-- > 0 ? setImmediate(step) : r());
      step();
    });
    ac.abort();
    await withTimeout(done, STEP, 'lead()');
    if (!nothingHeld(db)) heldAfter++;
  }
  assert.equal(heldAfter, 0);
});

// Call ensureHeld() in a loop, synchronously (the native loss callback
// cannot reach the loop meanwhile), until it throws SIDELEASE_LOST (true)
// or STEP passes (false).
function spinUntilLost(lease) {
  const deadline = Date.now() + STEP;
  while (Date.now() < deadline) {
    try {
      lease.ensureHeld();
    } catch (err) {
      if (err.code === 'SIDELEASE_LOST') return true;
    }
  }
  return false;
}

async function lostLease(dir) {
  const db = path.join(dir, 'app.db');
  const rival = await Holder.start(path.join(dir, 'rival.db'));
  const lease = sidelease.acquire(db);
  fs.renameSync(path.join(dir, 'rival.db.backend-lease'), lease.leasePath);
  assert.ok(spinUntilLost(lease), 'the loss was never seen');
  return { lease, rival };
}

for (const order of ['signal read before release', 'signal first read after release']) {
  test(`a lost lease: ${order} says aborted, and lostReason stays`, async () => {
    const { lease, rival } = await lostLease(tmpdir());
    try {
      const before = order === 'signal read before release' ? [lease.signal.aborted, lease.lostReason] : null;
      lease.release();
      const after = [lease.signal.aborted, lease.lostReason];
      assert.equal(after[0], true);
      assert.match(after[1], new RegExp(String(rival.pid)));
      assert.equal(lease.signal.reason.code, 'SIDELEASE_LOST');
      if (before) assert.deepEqual(before, after);
    } finally {
      rival.close();
    }
  });
}

test('a lease released whole: signal and lostReason say not lost after release', () => {
  const lease = sidelease.acquire(path.join(tmpdir(), 'app.db'));
  lease.release();
  assert.equal(lease.signal.aborted, false);
  assert.equal(lease.lostReason, null);
});

test("ensureHeld() reporting a loss has aborted the lease's signal and the term's", async () => {
  const dir = tmpdir();
  const db = path.join(dir, 'app.db');
  const rival = await Holder.start(path.join(dir, 'rival.db'));
  const elector = new sidelease.Elector(db);
  let checked = null;
  const run = elector.run(async (lease, signal) => {
    fs.renameSync(path.join(dir, 'rival.db.backend-lease'), lease.leasePath);
    // Synchronously, in one turn of the loop: the native loss callback
    // cannot have reached the loop yet.
    if (spinUntilLost(lease)) checked = [lease.signal.aborted, signal.aborted];
    elector.stop();
  });
  try {
    await withTimeout(run, STEP, 'run()');
    assert.deepEqual(checked, [true, true]);
  } finally {
    rival.close();
  }
});
