// A wait that names who it waits for: acquireAsync's onWaiting and the
// sidelease:waiting diagnostics channel, once when the wait starts and
// again only when the holder changes (the change itself is tested in
// Python with a holder that hands its lock on; the core's logic is one).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import diagnostics from 'node:diagnostics_channel';
import fs from 'node:fs';
import path from 'node:path';

import * as sidelease from '../index.mjs';
import { Holder, tmpdir, withTimeout, STEP } from './helpers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('onWaiting and the channel name the holder once, within 1 s', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const h = await Holder.start(db);
  const heard = [];
  const published = [];
  const onPublish = (msg) => published.push(msg);
  diagnostics.subscribe('sidelease:waiting', onPublish);
  try {
    const t0 = performance.now();
    const wait = sidelease.acquireAsync(db, { timeout: 20_000, onWaiting: (info) => heard.push([performance.now() - t0, info]) });
    while (heard.length === 0 && performance.now() - t0 < STEP) await sleep(5);
    assert.equal(heard.length, 1);
    assert.ok(heard[0][0] < 1000, `within 1 s: ${heard[0][0]} ms`);
    const info = heard[0][1];
    assert.equal(info.holder.pid, h.pid);
    assert.deepEqual(info.holders, [h.pid]);
    assert.ok(info.message.includes(String(h.pid)), info.message);
    await sleep(500);
    assert.equal(heard.length, 1, 'nothing more while the holder stays');
    await h.release();
    const lease = await withTimeout(wait, STEP, 'acquireAsync');
    lease.release();
    assert.equal(heard.length, 1, JSON.stringify(heard.map(([t, i]) => [t, i.holder?.pid, i.holders])));
    assert.deepEqual(published, [info], 'the channel heard the same');
  } finally {
    diagnostics.unsubscribe('sidelease:waiting', onPublish);
    h.close();
  }
});

test('nothing is told without a wait; a throwing onWaiting ends the wait; bad uses are errors', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const heard = [];
  (await sidelease.acquireAsync(db, { onWaiting: (i) => heard.push(i) })).release();
  const h = await Holder.start(db);
  try {
    await assert.rejects(sidelease.acquireAsync(db, { onWaiting: (i) => heard.push(i) }), (e) => e.code === 'SIDELEASE_IN_USE');
    assert.deepEqual(heard, [], 'one attempt is no wait');
    const boom = new RangeError('from onWaiting');
    await assert.rejects(
      withTimeout(sidelease.acquireAsync(db, { timeout: 20_000, onWaiting: () => { throw boom; } }), STEP, 'acquireAsync'),
      (e) => e === boom,
    );
    assert.throws(() => sidelease.acquire(db, { timeout: 100, onWaiting: () => {} }), TypeError);
    await assert.rejects(sidelease.acquireAsync(db, { timeout: 100, onWaiting: 5 }), TypeError);
    assert.throws(() => new sidelease.Elector(db, { onWaiting: () => {} }), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT' && e.argument === 'options.onWaiting');
    await h.release();
    sidelease.acquire(db).release(); // nothing was left held
  } finally {
    h.close();
  }
});

test('a plain lease publishes acquired, released and lost on its channels', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const heard = [];
  const subs = ['acquired', 'released', 'lost'].map((n) => [`sidelease:${n}`, (msg) => heard.push([n, msg])]);
  for (const [name, f] of subs) diagnostics.subscribe(name, f);
  try {
    const a = sidelease.acquire(db);
    a.release();
    a.release(); // a second release is nothing, and says nothing
    const b = await sidelease.acquireAsync(db, { timeout: 1000 });
    assert.deepEqual(heard.map(([n, m]) => [n, m.target, m.lease === a ? 'a' : m.lease === b ? 'b' : '?']),
      [['acquired', db, 'a'], ['released', db, 'a'], ['acquired', db, 'b']]);
    assert.equal(heard[0][1].generation, a.generation);
    // Lost: a rival process's locked file renamed over the lease file (in
    // this test's directory).
    const rival = await Holder.start(path.join(path.dirname(db), 'rival.db'));
    fs.renameSync(path.join(path.dirname(db), 'rival.db.backend-lease'), b.leasePath);
    await withTimeout(new Promise((r) => (b.signal.aborted ? r() : b.signal.addEventListener('abort', r))), STEP, 'lost');
    await sleep(10);
    const lost = heard.filter(([n]) => n === 'lost');
    assert.equal(lost.length, 1, JSON.stringify(heard.map(([n]) => n)));
    assert.equal(lost[0][1].lease, b);
    assert.equal(lost[0][1].error.code, 'SIDELEASE_LOST');
    assert.equal(typeof lost[0][1].reason, 'string');
    b.release();
    rival.close();
  } finally {
    for (const [name, f] of subs) diagnostics.unsubscribe(name, f);
  }
});
