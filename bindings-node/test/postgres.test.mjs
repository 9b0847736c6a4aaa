// PostgreSQL leases from Node and Bun: acquireAsync woken by the server, an
// AbortSignal that leaves no waiter on the server, and lease.signal when the
// session is terminated. Needs the cluster tests/run starts (SIDELEASE_TEST_PG*).
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';

import * as sidelease from '../index.mjs';
import { Holder, withTimeout, STEP, pgUrl as url, psql, holderBackends, terminateHolder } from './helpers.mjs';

// Sessions of this process waiting for the lease `u`.
function waiters(u) {
  const name = u.split('lease=')[1];
  return Number(psql(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name LIKE 'sidelease ${process.pid}@% ${name}'`));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** This process's waiting sessions for `u` once there is one (its first
 * connection, on a loaded machine, takes a while), or 0 after STEP. */
async function waitingOnServer(u) {
  const deadline = Date.now() + STEP;
  let n = waiters(u);
  while (n === 0 && Date.now() < deadline) {
    await sleep(20);
    n = waiters(u);
  }
  return n;
}

describe('PostgreSQL leases', () => {
  test('acquireAsync waits on the server, keeps the loop free, and wakes on release', async () => {
    const u = url();
    const h = await Holder.start(u);
    try {
      await assert.rejects(sidelease.acquireAsync(u), (e) => e.code === 'SIDELEASE_IN_USE' && e.holder.pid === h.pid);
      let ticks = 0;
      const ticker = setInterval(() => ticks++, 10);
      const waiting = sidelease.acquireAsync(u, { timeout: STEP });
      await sleep(400);
      assert.equal(await waitingOnServer(u), 1);
      await h.release();
      const lease = await withTimeout(waiting, STEP, 'wake on release');
      clearInterval(ticker);
      assert.ok(ticks > 20, `the event loop stalled (${ticks} ticks)`);
      assert.equal(lease.generation, 2);
      assert.equal(lease.previousReleasedCleanly, true);
      assert.ok(!lease.leasePath.includes('app-secret'));
      const info = sidelease.inspect(u);
      assert.equal(info.state, 'held');
      assert.equal(info.recordStatus, 'self');
      assert.equal(info.server.clientAddr, '127.0.0.1');
      assert.equal(sidelease.inspect(new URL(u)).state, 'held');
      lease.release();
    } finally {
      h.close();
    }
  });

  test('an AbortSignal ends the wait and leaves no waiter on the server', async () => {
    const u = url();
    const h = await Holder.start(u);
    try {
      const ac = new AbortController();
      const waiting = sidelease.acquireAsync(u, { timeout: Infinity, signal: ac.signal });
      assert.equal(await waitingOnServer(u), 1);
      ac.abort();
      await assert.rejects(waiting, (e) => e.name === 'AbortError');
      let left = waiters(u);
      for (let i = 0; i < 100 && left; i++) {
        await sleep(20);
        left = waiters(u);
      }
      assert.equal(left, 0);
    } finally {
      h.close();
    }
  });

  test('terminating the session aborts lease.signal within 2 s', async () => {
    const u = url();
    const lease = sidelease.acquire(u);
    const aborted = new Promise((r) => lease.signal.addEventListener('abort', r, { once: true }));
    assert.equal(terminateHolder(u), 1);
    const t = Date.now();
    await withTimeout(aborted, 2000, 'lease.signal after pg_terminate_backend');
    assert.ok(Date.now() - t < 2000);
    assert.equal(lease.state, 'lost');
    assert.match(lease.lostReason, /terminating connection/);
    assert.throws(() => lease.ensureHeld(), (e) => e.code === 'SIDELEASE_LOST');
    lease.release();
  });

  test('ensureHeldNow asks the server off the event loop, and says lost once a stalled server passes the bound', async () => {
    const u = url();
    const lease = sidelease.acquire(`${u}&confirm_within=500`);
    for (let i = 0; i < 20; i++) await lease.ensureHeldNow();
    const backend = Number(psql(holderBackends(u)));
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    process.kill(backend, 'SIGSTOP');
    let took;
    try {
      const t = Date.now();
      await assert.rejects(lease.ensureHeldNow(), (e) => e.code === 'SIDELEASE_LOST' && /did not confirm/.test(e.message));
      took = Date.now() - t;
    } finally {
      process.kill(backend, 'SIGCONT');
      clearInterval(timer);
    }
    assert.ok(took > 50 && took < 900, `${took} ms`);
    assert.ok(ticks > 10, `the loop ticked ${ticks} times while the server was asked`);
    assert.equal(lease.state, 'lost');
    assert.throws(() => lease.ensureHeld(), (e) => e.code === 'SIDELEASE_LOST');
    lease.release();
    await assert.rejects(lease.ensureHeldNow(), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT' && /released/.test(e.message));
  });

  test('confirm_within out of range names the parameter', () => {
    assert.throws(() => sidelease.acquire(`${url()}&confirm_within=5000`),
      (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT' && /confirm_within=5000: milliseconds, 100 to 4000/.test(e.message));
  });
});
