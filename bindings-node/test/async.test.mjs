// acquireAsync: the event loop stays free, AbortSignal cancels, waits wake.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import * as sidelease from '../index.mjs';
import { Holder, here, self, tmpdir, withTimeout, STEP } from './helpers.mjs';

describe('acquireAsync', () => {
  test('acquires a free lease', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const lease = await sidelease.acquireAsync(db, { metadata: { a: 1 } });
    assert.deepEqual(lease.record.metadata, { a: 1 });
    lease.release();
  });

  test('in use, timeout, and a wait that wakes on release', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      await assert.rejects(sidelease.acquireAsync(db), (e) => e.code === 'SIDELEASE_IN_USE' && e.holders[0] === h.pid);
      await assert.rejects(sidelease.acquireAsync(db, { timeout: 200 }), (e) => e.code === 'SIDELEASE_TIMEOUT');
      const waiting = sidelease.acquireAsync(db, { timeout: STEP });
      await new Promise((r) => setTimeout(r, 100));
      const t = Date.now();
      await h.release();
      const lease = await withTimeout(waiting, STEP, 'wake on release');
      assert.ok(Date.now() - t < 1000);
      assert.equal(lease.previousReleasedCleanly, true);
      lease.release();
    } finally {
      h.close();
    }
  });

  test('a wait wakes when the holder is SIGKILLed', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      const waiting = sidelease.acquireAsync(db, { timeout: Infinity });
      await new Promise((r) => setTimeout(r, 100));
      await h.kill();
      const lease = await withTimeout(waiting, STEP, 'wake on kill');
      assert.equal(lease.previousReleasedCleanly, false);
      assert.equal(lease.previous.pid, h.pid);
      lease.release();
    } finally {
      h.close();
    }
  });

  test('AbortSignal cancels the wait and nothing stays held', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      const ac = new AbortController();
      const waiting = sidelease.acquireAsync(db, { timeout: Infinity, signal: ac.signal });
      await new Promise((r) => setTimeout(r, 100));
      const t = Date.now();
      ac.abort(new Error('shutting down'));
      await assert.rejects(waiting, (e) => {
        assert.equal(e.name, 'AbortError');
        assert.equal(e.code, 'ABORT_ERR');
        assert.equal(e.cause.message, 'shutting down');
        return true;
      });
      assert.ok(Date.now() - t < 1000);
      await assert.rejects(sidelease.acquireAsync(db, { signal: AbortSignal.abort() }), (e) => e.name === 'AbortError');
      await h.release();
      assert.equal(sidelease.inspect(db).state, 'free');
    } finally {
      h.close();
    }
  });

  test('an abort that lands after the lease was taken still rejects, holding nothing', async () => {
    for (let i = 0; i < 5; i++) {
      const db = path.join(tmpdir(), 'app.db');
      const ac = new AbortController();
      const pending = sidelease.acquireAsync(db, { signal: ac.signal });
      // Block the event loop while the native side takes the free lease, so
      // the result waits to be delivered; then abort before it is.
      const until = Date.now() + 100;
      while (Date.now() < until);
      ac.abort(new Error('timed out'));
      await assert.rejects(pending, (e) => e.name === 'AbortError' && e.cause.message === 'timed out');
      assert.equal(sidelease.inspect(db).state, 'free', 'the lease the abort overtook was released');
    }
  });

  test('an abort after a waited-for lease was taken, before the promise settled, rejects and holds nothing', async () => {
    // The holder lets go; without yielding, spin until the kernel shows
    // this process holding the lease (the native side took it), then abort
    // and only then look at the promise: it must reject, holding nothing.
    for (let i = 0; i < 3; i++) {
      const db = path.join(tmpdir(), 'app.db');
      const h = await Holder.start(db);
      try {
        const ac = new AbortController();
        const pending = sidelease.acquireAsync(db, { timeout: Infinity, signal: ac.signal });
        await new Promise((r) => setTimeout(r, 50));
        await h.releaseSoon(100);
        const until = Date.now() + STEP;
        while (!sidelease.inspect(db).holders.includes(process.pid)) {
          assert.ok(Date.now() < until, 'the native side never took the lease');
        }
        ac.abort(new Error('gave up'));
        assert.equal(ac.signal.aborted, true);
        await assert.rejects(pending, (e) => e.name === 'AbortError' && e.cause.message === 'gave up');
        await h.next('released');
        assert.equal(sidelease.inspect(db).state, 'free', 'the lease the abort overtook was released');
      } finally {
        h.close();
      }
    }
  });

  test('Promise.race with a timeout that aborts never leaks the lease', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      const ac = new AbortController();
      const timeout = new Promise((_, reject) =>
        setTimeout(() => {
          ac.abort(new Error('too slow'));
          reject(new Error('too slow'));
        }, 150),
      );
      // When the lease wins the race (under an emulator, often), nothing
      // else reads this rejection: it must not go unhandled.
      timeout.catch(() => {});
      const acquired = sidelease.acquireAsync(db, { timeout: Infinity, signal: ac.signal });
      // Read at once: the abort can settle it while the holder is still
      // being told to let go (under an emulator telling it takes longer
      // than the timeout), and a rejection nobody reads yet goes unhandled.
      const settled = acquired.then((l) => l, (e) => e);
      // The holder lets go at about the moment the timeout fires.
      await h.releaseSoon(150);
      let lease = null;
      try {
        lease = await Promise.race([acquired, timeout]);
      } catch {
        // timed out: the acquisition must end holding nothing
      }
      const outcome = await settled;
      if (lease) {
        assert.equal(outcome, lease, 'the race gave the caller the lease it won');
        lease.release();
      } else {
        assert.equal(outcome.name, 'AbortError', 'aborted before it settled: rejected');
      }
      await h.next('released');
      assert.equal(sidelease.inspect(db).state, 'free', 'nothing is held behind the caller');
    } finally {
      h.close();
    }
  });

  test('eight pending waits leave the event loop and fs free', async () => {
    const dir = tmpdir();
    const db = path.join(dir, 'app.db');
    const h = await Holder.start(db);
    try {
      const waits = Array.from({ length: 8 }, () => sidelease.acquireAsync(db, { timeout: STEP }));
      await new Promise((r) => setTimeout(r, 50));
      const file = path.join(dir, 'data.txt');
      fs.writeFileSync(file, 'x'.repeat(1000));
      // With the thread pool taken by the waits a read would wait for
      // the release, which comes only after: any read that returns at all
      // shows the pool free; 1 s leaves a loaded machine its late wake-ups.
      for (let i = 0; i < 5; i++) {
        const t = performance.now();
        assert.equal((await fs.promises.readFile(file, 'utf8')).length, 1000);
        assert.ok(performance.now() - t < 1000, `readFile took ${performance.now() - t} ms`);
      }
      await h.release();
      const leases = await withTimeout(Promise.all(waits), STEP, 'eight waits');
      assert.equal(new Set(leases.map((l) => l.record.nonce)).size, 1, 'all share one lease');
      for (const l of leases) l.release();
      assert.equal(sidelease.inspect(db).state, 'free');
    } finally {
      h.close();
    }
  });

  // Waits released together run their acquisitions on the runtime's
  // workers: one fewer than the cores, so the event loop keeps one
  // (docs/node.md); TOKIO_WORKER_THREADS decides when set.
  test('the runtime leaves a core to the event loop, or runs TOKIO_WORKER_THREADS workers when that is a positive number', async () => {
    const { TOKIO_WORKER_THREADS: _, ...unset } = process.env;
    const run = (env) => JSON.parse(
      execFileSync(...self([path.join(here, 'fixtures', 'runtime-workers.cjs'), tmpdir()]), {
        encoding: 'utf8',
        timeout: 30_000,
        env: { ...unset, ...env },
      }),
    );
    // Node counts the cores it may run on; the addon also heeds a cgroup's
    // CPU quota, which can only make it fewer.
    const cores = os.availableParallelism ? os.availableParallelism() : os.cpus().length;
    const fewer = (w) => w >= 1 && w <= Math.max(1, cores - 1);
    const { workers } = run({});
    assert.ok(fewer(workers), `${workers} workers on ${cores} cores`);
    assert.deepEqual(run({ TOKIO_WORKER_THREADS: '3' }), { workers: 3 });
    // Not a positive number: passed over (tokio itself would panic as the
    // addon loads).
    for (const bad of ['0', 'abc', '']) {
      assert.deepEqual(run({ TOKIO_WORKER_THREADS: bad }), { workers }, bad);
    }
  });

  // The fixture waits twice for the watch to go idle (2 s each) and takes
  // 150 new lease files: about 7 s, past Bun's 5 s default.
  test('150 waits share two inotify instances beside the watch\'s, and an idle process keeps none', { timeout: 60_000 }, async () => {
    const out = JSON.parse(
      execFileSync(...self([path.join(here, 'fixtures', 'instances.cjs'), tmpdir()]), {
        encoding: 'utf8',
        timeout: 60_000,
      }),
    );
    // Waiting: one instance for the first wait, one for all the others,
    // and the watch's, made at the first attempt (docs/algorithm.md, "A
    // killed holder's lock").
    assert.deepEqual(out, { start: 0, holding: 1, idleAfterHolding: 0, waiting: 3, acquired: 150, idleAfterWaits: 0 });
  });
});
