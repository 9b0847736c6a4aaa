// `using` (explicit resource management) where the runtime has it: Bun.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import * as sidelease from '../../index.mjs';
import { tmpdir } from '../helpers.mjs';

test('using releases at the end of the block', () => {
  const db = path.join(tmpdir(), 'app.db');
  {
    using lease = sidelease.acquire(db);
    assert.equal(lease.check(), 'held');
    assert.equal(sidelease.inspect(db).state, 'held');
  }
  assert.equal(sidelease.inspect(db).state, 'free');
});
