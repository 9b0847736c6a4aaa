// Two worker threads of one process share a lease as two threads do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

import * as sidelease from '../index.mjs';
import { tmpdir, withTimeout, STEP, here } from './helpers.mjs';

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
