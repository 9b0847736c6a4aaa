// Two worker threads of one process share a lease as two threads do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

import * as sidelease from '../index.mjs';
import { Holder, tmpdir, withTimeout, STEP, here } from './helpers.mjs';

const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const sidelease = require(workerData.index);
const lease = sidelease.acquire(workerData.db);
parentPort.postMessage({ nonce: lease.record.nonce, pid: lease.record.pid });
parentPort.once('message', () => { lease.release(); parentPort.postMessage({ released: true }); });
`;

function start(db) {
  const w = new Worker(WORKER, { eval: true, workerData: { db, index: path.join(here, '..', 'index.js') } });
  const next = () => withTimeout(new Promise((r, j) => { w.once('message', r); w.once('error', j); }), STEP, 'worker');
  return { w, next };
}

test('two workers share one lease', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const a = start(db);
  const first = await a.next();
  const b = start(db);
  const second = await b.next();
  assert.equal(first.nonce, second.nonce);
  assert.equal(first.pid, process.pid);
  a.w.postMessage('release');
  await a.next();
  assert.equal(sidelease.inspect(db).state, 'held');
  b.w.postMessage('release');
  await b.next();
  assert.equal(sidelease.inspect(db).state, 'free');
  await a.w.terminate();
  await b.w.terminate();
});

function leaseFds(db) {
  const lease = `${db}.backend-lease`;
  let files = 0;
  let inotify = 0;
  for (const fd of fs.readdirSync('/proc/self/fd')) {
    let link;
    try {
      link = fs.readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue;
    }
    if (link === lease) files++;
    if (link === 'anon_inode:inotify') inotify++;
  }
  return { files, inotify };
}

const WAITING_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const sidelease = require(workerData.index);
sidelease.acquireAsync(workerData.db, { timeout: Infinity }).then((l) => parentPort.postMessage({ acquired: l.record.nonce }));
setTimeout(() => parentPort.postMessage({ waiting: true }), 100);
`;

test('a worker terminated while it waits leaves nothing waiting and takes nothing', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const holder = await Holder.start(db);
  try {
    const before = leaseFds(db);
    const w = new Worker(WAITING_WORKER, { eval: true, workerData: { db, index: path.join(here, '..', 'index.js') } });
    const msg = await withTimeout(new Promise((r, j) => { w.once('message', r); w.once('error', j); }), STEP, 'worker');
    assert.deepEqual(msg, { waiting: true });
    await w.terminate();
    await holder.release();
    // Long enough for a leaked wait to wake and take the lease.
    await new Promise((r) => setTimeout(r, 300));
    const seen = sidelease.inspect(db);
    assert.equal(seen.state, 'free', `held by ${JSON.stringify(seen.holders)} after the worker was terminated`);
    assert.equal(leaseFds(db).files, before.files, 'the wait\'s lease file descriptor was closed');
  } finally {
    holder.close();
  }
});

test('a worker terminated while it holds a lease releases it; a handle elsewhere keeps it', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const a = start(db);
  const first = await a.next();
  await a.w.terminate();
  assert.equal(sidelease.inspect(db).state, 'free', 'the terminated worker\'s lease was released');
  assert.equal(leaseFds(db).files, 0);

  const mine = sidelease.acquire(db);
  const b = start(db);
  const second = await b.next();
  assert.equal(second.nonce, mine.record.nonce, 'shared with this thread');
  assert.notEqual(second.nonce, first.nonce);
  await b.w.terminate();
  assert.equal(sidelease.inspect(db).state, 'held', 'this thread\'s handle still holds it');
  mine.release();
  assert.equal(sidelease.inspect(db).state, 'free');
});
