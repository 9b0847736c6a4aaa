// The synchronous API, errors and their fields, under Node and Bun.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';

import * as sidelease from '../index.mjs';
import { Holder, here, self, tmpdir, isBun, withTimeout, STEP } from './helpers.mjs';

const require = createRequire(import.meta.url);

describe('acquire', () => {
  test('acquires, reports its fields and releases once', () => {
    const db = path.join(tmpdir(), 'app.db');
    const lease = sidelease.acquire(db, { metadata: { app: 't', port: 8000 } });
    assert.equal(lease.leasePath, db + '.backend-lease');
    assert.equal(lease.target, db);
    assert.equal(lease.record.pid, process.pid);
    assert.match(lease.record.runtime, isBun ? /^bun \d/ : /^node \d/);
    assert.deepEqual(lease.record.metadata, { app: 't', port: 8000 });
    // A first lease file: the generation starts at the clock, and no
    // record says how the last holder ended (issue 35).
    const first = lease.generation;
    assert.ok(first > 1_600_000_000_000_000 && Number.isSafeInteger(first), String(first));
    assert.equal(lease.previous, null);
    assert.equal(lease.previousReleasedCleanly, null);
    assert.equal(lease.recordWritten, true);
    assert.equal(lease.check(), 'held');
    assert.equal(lease.released, false);
    lease.release();
    lease.release();
    assert.equal(lease.released, true);
    assert.throws(() => lease.check(), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT' && /released/.test(e.message));
    const again = sidelease.acquire(pathToFileURL(db));
    assert.equal(again.generation, first + 1);
    assert.equal(again.previousReleasedCleanly, true);
    assert.ok(again.previous.released_at);
    again[Symbol.dispose]();
    assert.equal(again.released, true);
  });

  test('handles of one process share one lease', () => {
    const db = path.join(tmpdir(), 'app.db');
    const a = sidelease.acquire(db);
    const b = sidelease.acquire(db);
    assert.equal(a.record.nonce, b.record.nonce);
    a.release();
    assert.equal(sidelease.inspect(db).state, 'held');
    b.release();
    assert.equal(sidelease.inspect(db).state, 'free');
  });

  test('check sees the file unlinked and replaced', () => {
    const dir = tmpdir();
    const db = path.join(dir, 'app.db');
    // Without the holder's watch, which would put the file back at once.
    const lease = sidelease.acquire(db, { watch: false });
    fs.writeFileSync(path.join(dir, 'replacement'), '');
    fs.renameSync(path.join(dir, 'replacement'), lease.leasePath);
    assert.equal(lease.check(), 'replaced');
    fs.unlinkSync(lease.leasePath);
    assert.equal(lease.check(), 'unlinked');
    lease.release();
  });

  test('garbage collection never releases a lease', async () => {
    const db = path.join(tmpdir(), 'app.db');
    (() => { sidelease.acquire(db); })();
    for (let i = 0; i < 5; i++) {
      if (isBun) Bun.gc(true);
      else if (globalThis.gc) globalThis.gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(sidelease.inspect(db).state, 'held');
    // Released only by this process's exit: share it, then let both go.
    const again = sidelease.acquire(db);
    assert.equal(sidelease.inspect(db).recordStatus, 'self');
    again.release();
  });

  test('inspect answers in camelCase, never creating the file', () => {
    const db = path.join(tmpdir(), 'app.db');
    const i = sidelease.inspect(db);
    assert.deepEqual(Object.keys(i).sort(), [
      'former', 'holders', 'leasePath', 'orphans', 'platform', 'record', 'recordStatus', 'server', 'state', 'target', 'unattributed',
    ]);
    assert.equal(i.server, null);
    assert.equal(i.state, 'free');
    assert.equal(i.recordStatus, 'empty');
    assert.equal(fs.existsSync(db + '.backend-lease'), false);
    assert.equal(sidelease.inspect(db, { suffix: '.other' }).leasePath, db + '.other');
  });

  test('require and import give the same module', () => {
    assert.equal(require('../index.js').acquire, sidelease.acquire);
    assert.equal(sidelease.version, require('../package.json').version);
  });
});

describe('errors', () => {
  test('in use names the holder, its pid and runtime', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      assert.throws(() => sidelease.acquire(db), (e) => {
        assert.ok(e instanceof sidelease.SideleaseError);
        assert.equal(e.code, 'SIDELEASE_IN_USE');
        assert.equal(e.holder.pid, h.pid);
        assert.deepEqual(e.holder.metadata, { role: 'holder' });
        assert.deepEqual(e.holders, [h.pid]);
        assert.equal(e.leasePath, db + '.backend-lease');
        assert.match(e.message, new RegExp(`is leased by pid ${h.pid} \\((node|bun) `));
        return true;
      });
      const i = sidelease.inspect(db);
      assert.equal(i.state, 'held');
      assert.deepEqual(i.holders, [h.pid]);
      assert.equal(i.recordStatus, 'live');
      const t = Date.now();
      assert.throws(() => sidelease.acquire(db, { timeout: 300 }), (e) => e.code === 'SIDELEASE_TIMEOUT' && e.holders[0] === h.pid);
      assert.ok(Date.now() - t >= 290);
    } finally {
      h.close();
    }
  });

  test('I/O errors carry errno, syscall and path', () => {
    const dir = tmpdir();
    assert.throws(() => sidelease.acquire(path.join(dir, 'missing', 'app.db')), (e) => {
      assert.equal(e.code, 'SIDELEASE_IO');
      assert.equal(e.errno, -2);
      assert.equal(e.syscall, 'open');
      assert.equal(e.path, path.join(dir, 'missing'));
      return true;
    });
    fs.mkdirSync(path.join(dir, 'd.db.backend-lease'));
    assert.throws(() => sidelease.acquire(path.join(dir, 'd.db')), (e) => e.code === 'SIDELEASE_IO' && e.errno === -21);
  });

  test('unsupported filesystems are refused, naming them', () => {
    assert.throws(() => sidelease.acquire('/proc/sidelease-js-test.db'), (e) => {
      assert.equal(e.code, 'SIDELEASE_UNSUPPORTED_FS');
      assert.equal(e.fstype, 'proc');
      assert.match(e.message, /allow_unsupported_fs/);
      return true;
    });
  });

  test('bad values are SIDELEASE_INVALID_ARGUMENT naming the argument', () => {
    const db = path.join(tmpdir(), 'app.db');
    const cases = [
      ['', {}, 'target'],
      [db, { suffix: '' }, 'suffix'],
      [db, { suffix: 'a/b' }, 'suffix'],
      [db, { timeout: -1 }, 'timeout'],
      [db, { timeout: NaN }, 'timeout'],
      [db, { metadata: { big: 'x'.repeat(20000) } }, 'metadata'],
      [db, { metadata: { n: 10n } }, 'metadata'],
    ];
    for (const [target, options, argument] of cases) {
      assert.throws(() => sidelease.acquire(target, options), (e) => {
        assert.equal(e.code, 'SIDELEASE_INVALID_ARGUMENT', argument);
        assert.equal(e.argument, argument);
        return true;
      });
    }
  });

  test('a lease file named as the target is refused, naming its database', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const lease = `${db}.backend-lease`;
    const refused = (e) => {
      assert.equal(e.code, 'SIDELEASE_INVALID_ARGUMENT');
      assert.equal(e.argument, 'target');
      assert.ok(e.message.includes(`${lease} is a lease file`) && e.message.includes(`did you mean ${db}?`), e.message);
      return true;
    };
    assert.throws(() => sidelease.acquire(lease), refused);
    assert.throws(() => sidelease.inspect(lease), refused);
    await assert.rejects(sidelease.acquireAsync(lease), refused);
    assert.ok(!fs.existsSync(`${lease}.backend-lease`), 'no lease file of the lease file');
  });

  test('unknown options and metadata JSON cannot hold are refused, naming them', () => {
    const db = path.join(tmpdir(), 'app.db');
    const cases = [
      [{ timout: 5000 }, 'options', /unknown option `timout`/],
      [{ metadata: { m: new Map([[1, 2]]) } }, 'metadata', /metadata\.m is a Map/],
      [{ metadata: { a: [1, NaN] } }, 'metadata', /metadata\.a\[1\] is NaN/],
      [{ metadata: { a: { b: Infinity } } }, 'metadata', /metadata\.a\.b is Infinity/],
      [{ metadata: { u: undefined } }, 'metadata', /metadata\.u is undefined/],
      [{ metadata: { d: new Date(0) } }, 'metadata', /metadata\.d is a Date/],
      [{ metadata: { f() {} } }, 'metadata', /metadata\.f is function/],
      [{ metadata: { n: 10n } }, 'metadata', /metadata\.n is a bigint/],
    ];
    for (const [options, argument, message] of cases) {
      assert.throws(() => sidelease.acquire(db, options), (e) => {
        assert.equal(e.code, 'SIDELEASE_INVALID_ARGUMENT', String(message));
        assert.equal(e.argument, argument);
        assert.match(e.message, message);
        return true;
      });
    }
    assert.throws(() => sidelease.inspect(db, { sufix: '.x' }), (e) => e.argument === 'options');
    assert.equal(sidelease.inspect(db).state, 'free', 'nothing refused was taken');
  });

  test('timeout null waits like Infinity, and a file: URL string is a URL', async () => {
    const dir = tmpdir();
    const db = path.join(dir, 'app.db');
    const h = await Holder.start(db);
    try {
      const waiting = sidelease.acquireAsync(db, { timeout: null });
      await new Promise((r) => setTimeout(r, 200));
      await h.release();
      const lease = await withTimeout(waiting, STEP, 'a null timeout waits');
      lease.release();
    } finally {
      h.close();
    }
    const lease = sidelease.acquire(`file://${db}`);
    assert.equal(lease.target, db);
    lease.release();
  });

  test('an error survives JSON.stringify whole', async () => {
    const db = path.join(tmpdir(), 'app.db');
    const h = await Holder.start(db);
    try {
      assert.throws(() => sidelease.acquire(db), (e) => {
        const j = JSON.parse(JSON.stringify(e));
        assert.equal(j.message, e.message);
        assert.equal(j.name, 'SideleaseError');
        assert.equal(j.code, 'SIDELEASE_IN_USE');
        assert.deepEqual(j.holders, [h.pid]);
        return true;
      });
    } finally {
      h.close();
    }
  });

  test('wrong types are TypeErrors', () => {
    const db = path.join(tmpdir(), 'app.db');
    const cases = [
      [123, undefined], [null, undefined], [db, 'x'], [db, { timeout: '1' }],
      [db, { suffix: 5 }], [db, { metadata: [1] }], [db, { splitGuard: 'yes' }],
      [db, { allowUnsupportedFs: 1 }],
    ];
    for (const [target, options] of cases) {
      assert.throws(() => sidelease.acquire(target, options), TypeError);
    }
    assert.throws(() => sidelease.inspect(db, { suffix: 1 }), TypeError);
    return assert.rejects(sidelease.acquireAsync(db, { signal: 'no' }), TypeError);
  });
});

// 200,000 cycles take several seconds here: past bun test's 5 s default.
test('release() frees the native state: 200,000 cycles in a tight loop keep memory flat', { timeout: 120_000 }, () => {
  const out = execFileSync(...self([path.join(here, 'fixtures', 'memory.cjs'), tmpdir(), '200000']), {
    encoding: 'utf8',
    timeout: 120_000,
  });
  const { perCycle } = JSON.parse(out);
  // A handle kept its native state (~2.5 KB, ~3.8 KB with metadata) until
  // a finalizer ran; a released one keeps only a small JS object.
  assert.ok(perCycle < 300, `${perCycle.toFixed(0)} bytes of resident memory per cycle`);
});

test('after release(): every field reads as it did while held, whatever was read before', () => {
  const FIELDS = ['leasePath', 'target', 'generation', 'previousReleasedCleanly', 'recordWritten', 'record', 'previous'];
  const db = path.join(tmpdir(), 'app.db');
  sidelease.acquire(db, { metadata: { n: 1 } }).release(); // a previous record to read
  // Read everything while held, release, and compare; then a second lease
  // of which nothing was read before release: the same answers.
  const read = sidelease.acquire(db, { metadata: { n: 2 } });
  const held = Object.fromEntries(FIELDS.map((f) => [f, read[f]]));
  read.release();
  for (const f of FIELDS) assert.deepEqual(read[f], held[f], `lease.${f} after release`);
  const unread = sidelease.acquire(db, { metadata: { n: 3 } });
  unread.release();
  assert.equal(unread.released, true);
  assert.equal(unread.state, 'released');
  assert.equal(unread.generation, held.generation + 1);
  assert.equal(unread.leasePath, held.leasePath);
  assert.equal(unread.target, held.target);
  assert.equal(unread.previousReleasedCleanly, true);
  assert.equal(unread.recordWritten, true);
  assert.deepEqual(unread.record.metadata, { n: 3 });
  assert.equal(unread.previous.nonce, held.record.nonce, 'the previous record is the one read before');
  assert.notEqual(unread.record, unread.record, 'a fresh object on every read');
  assert.throws(() => unread.check(), (e) => e.code === 'SIDELEASE_INVALID_ARGUMENT');
  unread.release(); // a second release does nothing
  assert.equal(unread.generation, held.generation + 1);
});
