// Leader election from Node and Bun: lead() and the Elector emitter against
// real campaigner processes (fixtures/campaigner.cjs) with an overlap
// detector beside the lease: SIGKILLed leaders, a rival taking the lease
// file, a terminated PostgreSQL session; and in one process, events, the
// diagnostics channels, the snapshot, stop, back-off and bad arguments.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import diagnostics from 'node:diagnostics_channel';
import fs from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

import * as sidelease from '../index.mjs';
import { Holder, here, self, tmpdir, withTimeout, STEP, pgUrl, terminateHolder } from './helpers.mjs';

// Process starts under a loaded run take seconds: past bun test's 5 s default.
const SLOW = { timeout: 60_000 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Campaign {
  constructor(form, target) {
    const dir = tmpdir();
    this.form = form;
    this.target = target ?? path.join(dir, 'app.db');
    this.detector = path.join(dir, 'detector');
    this.log = path.join(dir, 'events.log');
    this.procs = new Map();
    this.seen = 0;
  }

  spawn() {
    const p = spawn(...self([path.join(here, 'fixtures', 'campaigner.cjs'), this.form, this.target, this.detector, this.log]), {
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    this.procs.set(p.pid, p);
    return p.pid;
  }

  lines() {
    let text = '';
    try {
      text = fs.readFileSync(this.log, 'utf8');
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    return text.split('\n').filter(Boolean).map((l) => {
      const i = l.indexOf(' ');
      return [Number(l.slice(0, i)), l.slice(i + 1)];
    });
  }

  /** The first line after those already read that `pred` accepts. */
  async next(pred, within = STEP) {
    const deadline = Date.now() + within;
    while (Date.now() < deadline) {
      const lines = this.lines();
      for (let i = this.seen; i < lines.length; i++) {
        if (pred(...lines[i])) {
          this.seen = i + 1;
          return lines[i];
        }
      }
      await sleep(2);
    }
    throw new Error(`no such line within ${within} ms; the log: ${JSON.stringify(this.lines().slice(-20))}`);
  }

  overlaps() {
    return this.lines().filter(([, what]) => what === 'overlap');
  }

  async kill(pid) {
    const p = this.procs.get(pid);
    assert.ok(p.exitCode === null && p.signalCode === null, `campaigner ${pid} ended by itself (${p.exitCode ?? p.signalCode})`);
    const exited = new Promise((r) => p.once('exit', r));
    process.kill(pid, 'SIGKILL');
    await withTimeout(exited, STEP, `campaigner ${pid} exit`);
    this.procs.delete(pid);
  }

  close() {
    for (const p of this.procs.values()) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
}

describe('leader election across processes', () => {
  for (const [form, kills] of [['lead', 100], ['emitter', 25]]) {
    test(`${form}: a SIGKILLed leader is succeeded every time, never beside another (${kills} kills)`, SLOW, async () => {
      const c = new Campaign(form);
      try {
        for (let i = 0; i < 4; i++) c.spawn();
        const killed = new Set();
        let [leader] = await c.next((pid, what) => what === 'leading');
        for (let i = 0; i < kills; i++) {
          await c.kill(leader);
          killed.add(leader);
          c.spawn();
          const [next] = await c.next((pid, what) => what === 'leading');
          assert.ok(!killed.has(next), `a killed leader ${next} led again`);
          leader = next;
        }
        assert.deepEqual(c.overlaps(), []);
      } finally {
        c.close();
      }
    });

    test(`${form}: a rival taking the lease file aborts the work, and it campaigns again`, SLOW, async () => {
      const c = new Campaign(form);
      const dir = path.dirname(c.target);
      const rival = await Holder.start(path.join(dir, 'rival.db'));
      try {
        c.spawn();
        c.spawn();
        const [leader] = await c.next((pid, what) => what === 'leading');
        const t = Date.now();
        fs.renameSync(path.join(dir, 'rival.db.backend-lease'), `${c.target}.backend-lease`);
        await c.next((pid, what) => pid === leader && what === 'cancelled lost', 5000);
        assert.ok(Date.now() - t < 2000, `aborted after ${Date.now() - t} ms`);
        await sleep(300);
        assert.deepEqual(c.lines().slice(c.seen).filter(([, w]) => w === 'leading'), [], 'nobody leads while the rival holds it');
        await rival.kill();
        await c.next((pid, what) => what === 'leading');
        assert.deepEqual(c.overlaps(), []);
        for (const p of c.procs.values()) assert.equal(p.exitCode, null, 'every campaigner still campaigns');
      } finally {
        rival.close();
        c.close();
      }
    });
  }

  // The server frees the lock the moment the session is ended and grants a
  // waiter at once, while the old leader learns of it from its socket: the
  // new term waits out the old one's bound (confirm_within) before its work
  // starts, so the two never overlap.
  test('PostgreSQL: a terminated session aborts the work before a successor starts', SLOW, async () => {
    const url = `${pgUrl()}&confirm_within=300`;
    const c = new Campaign('lead', url);
    try {
      for (let i = 0; i < 3; i++) c.spawn();
      let [leader] = await c.next((pid, what) => what === 'leading');
      const gaps = [];
      for (let i = 0; i < 4; i++) {
        const t = performance.now();
        assert.equal(terminateHolder(url), 1);
        const was = leader;
        await c.next((pid, what) => pid === was && what === 'cancelled lost', 5000);
        [leader] = await c.next((pid, what) => what === 'leading');
        gaps.push(performance.now() - t);
      }
      const kills = [];
      for (let i = 0; i < 4; i++) {
        // A successor campaigning already (not one still starting its
        // runtime, which on a loaded machine takes longer than the bound).
        const fresh = c.spawn();
        await c.next((pid, what) => pid === fresh && what === 'waiting');
        const t = performance.now();
        await c.kill(leader);
        const [next] = await c.next((pid, what) => what === 'leading');
        kills.push(performance.now() - t);
        assert.notEqual(next, leader);
        leader = next;
      }
      assert.deepEqual(c.overlaps(), [], JSON.stringify(c.lines()));
      // Each successor of a terminated leader waited out the bound, and not
      // much more; one of a killed leader on this host, provably gone, did
      // not wait it out.
      assert.ok(gaps.every((g) => g >= 300 && g < 3000), JSON.stringify(gaps));
      assert.ok(kills.every((g) => g < 300), JSON.stringify(kills));
    } finally {
      c.close();
    }
  });
});

describe('leader election in one process', () => {
  test('events, diagnostics channels and the snapshot; stop aborts the work and steps down', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const heard = [];
    const onChannel = (name) => (msg) => heard.push([name, msg]);
    const subs = ['elected', 'stepped-down', 'stopped'].map((n) => [`sidelease:${n}`, onChannel(n)]);
    for (const [ch, f] of subs) diagnostics.subscribe(ch, f);
    try {
      const e = new sidelease.Elector(db);
      const events = [];
      for (const k of ['elected', 'lost', 'stepped-down', 'stopped']) e.on(k, (info) => events.push([k, info]));
      let reason;
      const running = new Promise((resolve) => {
        e.start(async (lease, signal) => {
          resolve(lease);
          await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
          reason = signal.reason;
        });
      });
      const lease = await withTimeout(running, STEP, 'elected');
      const snap = e.snapshot;
      assert.equal(snap.leading, true);
      assert.ok(snap.generation > 1_600_000_000_000_000, String(snap.generation));
      assert.equal(snap.elections, 1);
      assert.ok(Math.abs(snap.leaderSince - Date.now()) < 5000);
      assert.equal(e.isLeader, true);
      assert.equal(sidelease.inspect(db).state, 'held');
      await e.stop();
      assert.equal(reason.name, 'AbortError');
      assert.equal(lease.released, true);
      assert.deepEqual(events.map(([k]) => k), ['elected', 'stepped-down', 'stopped']);
      assert.equal(events[1][1].why, 'stopped');
      assert.deepEqual(heard.map(([k]) => k), ['elected', 'stepped-down', 'stopped']);
      assert.equal(heard[0][1].generation, snap.generation);
      assert.equal(e.isLeader, false);
      assert.equal(e.snapshot.leaderSince, null);
      assert.equal(sidelease.inspect(db).state, 'free');
    } finally {
      for (const [ch, f] of subs) diagnostics.unsubscribe(ch, f);
    }
  });

  test('a campaign names the holder once, and is elected when it lets go', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const holder = await Holder.start(db);
    try {
      const e = new sidelease.Elector(db);
      const waiting = [];
      e.on('waiting', (info) => waiting.push(info));
      const elected = new Promise((r) => e.once('elected', r));
      e.start();
      await sleep(500);
      assert.equal(waiting.length, 1, JSON.stringify(waiting));
      assert.equal(waiting[0].holder.pid, holder.pid);
      assert.deepEqual(waiting[0].holders, [holder.pid]);
      assert.match(waiting[0].message, new RegExp(`leased by pid ${holder.pid}`));
      await holder.release();
      await withTimeout(elected, 2000, 'elected after the holder let go');
      await e.stop();
    } finally {
      holder.close();
    }
  });

  test('work that throws steps down and backs off; the outer signal ends lead()', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const controller = new AbortController();
    const times = [];
    const downs = [];
    const ticks = { n: 0 };
    const ticker = setInterval(() => ticks.n++, 10);
    try {
      const e = new sidelease.Elector(db, { signal: controller.signal });
      e.on('stepped-down', (info) => downs.push(info));
      await withTimeout(
        e.run(async (lease, signal) => {
          times.push(Date.now());
          if (times.length < 3) throw new RangeError('boom');
          controller.abort();
          assert.equal(signal.aborted, true);
        }),
        STEP,
        'run',
      );
      assert.equal(times.length, 3);
      assert.ok(times[1] - times[0] >= 95 && times[2] - times[1] >= 195, JSON.stringify(times));
      assert.ok(ticks.n > 10, 'the event loop ran through the back-off');
      assert.equal(downs[0].why, 'error');
      assert.equal(downs[0].detail, 'RangeError: boom');
      assert.ok(downs[0].error instanceof RangeError);
      assert.equal(downs[2].why, 'stopped');
      assert.equal(e.snapshot.failures, 2);
      let ran = 0;
      await sidelease.lead(db, async () => ran++, { signal: controller.signal });
      assert.equal(ran, 0, 'an aborted signal campaigns not at all');
    } finally {
      clearInterval(ticker);
    }
  });

  test('bad arguments are errors naming them', () => {
    const db = path.join(tmpdir(), 'app.db');
    assert.throws(() => new sidelease.Elector(db, { timeout: 5 }), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT' && e.argument === 'options.timeout');
    assert.throws(() => new sidelease.Elector(db, { signal: 1 }), TypeError);
    assert.throws(() => new sidelease.Elector('postgres:/nohost'), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT');
    assert.rejects(() => sidelease.lead(db, 'work'), TypeError);
    const e = new sidelease.Elector(db);
    assert.throws(() => e.run(7), TypeError);
    e.stop();
  });

  test('an elector stopped before it ran is closed at once; a path that names no file is refused', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const e = new sidelease.Elector(db);
    const said = [];
    e.on('stopped', () => said.push('stopped'));
    await e.stop();
    assert.deepEqual(said, ['stopped'], 'closed, and told, without a loop');
    assert.equal(e.snapshot.leading, false);
    let ran = 0;
    await withTimeout(e.run(async () => ran++), STEP, 'run after stop');
    assert.equal(ran, 0);
    assert.equal(sidelease.inspect(db).state, 'free');
    const missing = path.join(tmpdir(), 'missing', 'app.db');
    const retried = [];
    const m = new sidelease.Elector(missing);
    m.on('retrying', (info) => retried.push(info));
    await assert.rejects(withTimeout(m.run(), STEP, 'run'), (err) => err.code === 'SIDELEASE_IO' && err.message.includes('missing'));
    assert.deepEqual(retried, []);
    // A lease file named as the target: refused at once, naming its database.
    const l = new sidelease.Elector(`${db}.backend-lease`);
    l.on('retrying', (info) => retried.push(info));
    await assert.rejects(withTimeout(l.run(), STEP, 'run'), (err) =>
      err.code === 'SIDELEASE_INVALID_ARGUMENT' && err.message.includes(`did you mean ${db}?`));
    assert.deepEqual(retried, []);
  });
});


const ELECTING_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const sidelease = require(workerData.index);
const e = new sidelease.Elector(workerData.db);
e.on('waiting', () => parentPort.postMessage('waiting'));
e.on('elected', () => parentPort.postMessage('elected'));
e.start();
`;

test('a terminated worker stops its elector: a term steps down, a campaign ends', async () => {
  const db = path.join(tmpdir(), 'app.db');
  const start = () => {
    const w = new Worker(ELECTING_WORKER, { eval: true, workerData: { db, index: path.join(here, '..', 'index.js') } });
    const said = withTimeout(new Promise((r, j) => { w.once('message', r); w.once('error', j); }), STEP, 'worker');
    return { w, said };
  };
  const leader = start();
  assert.equal(await leader.said, 'elected');
  assert.equal(sidelease.inspect(db).state, 'held');
  await leader.w.terminate();
  assert.equal(sidelease.inspect(db).state, 'free', 'the leading worker stepped down');
  const holder = await Holder.start(db);
  try {
    const campaigner = start();
    assert.equal(await campaigner.said, 'waiting');
    await campaigner.w.terminate();
    await holder.release();
    await sleep(300); // a campaign that went on would take it now
    assert.equal(sidelease.inspect(db).state, 'free');
  } finally {
    holder.close();
  }
});
