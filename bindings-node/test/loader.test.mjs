// Which addon the package loads: the platform package napi-rs would name for
// this OS, CPU and C library (index.js), and the error when it is missing.
// Each case runs a fresh Node whose platform, ldd and process.report are
// stood in for by a preload, so every platform's choice is exercised here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { tmpdir } from './helpers.mjs';

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

// Runs require('sidelease') from the working tree as a process on PLATFORM
// and ARCH whose /usr/bin/ldd reads LDD (null: there is none) and whose
// process.report gives REPORT.
function load({ platform = 'linux', arch = process.arch, ldd = null, report = null, execPath = null }) {
  const preload = path.join(tmpdir(), 'preload.cjs');
  fs.writeFileSync(
    preload,
    `'use strict';
const fs = require('node:fs');
const read = fs.readFileSync;
fs.readFileSync = function (file, ...rest) {
  if (file === '/usr/bin/ldd') {
    if (${JSON.stringify(ldd)} === null) throw Object.assign(new Error('ENOENT: /usr/bin/ldd'), { code: 'ENOENT' });
    return ${JSON.stringify(ldd)};
  }
  return read.call(this, file, ...rest);
};
Object.defineProperty(process, 'platform', { value: ${JSON.stringify(platform)} });
Object.defineProperty(process, 'arch', { value: ${JSON.stringify(arch)} });
const report = ${JSON.stringify(report)};
if (report) process.report.getReport = () => report;
if (${JSON.stringify(execPath)}) Object.defineProperty(process, 'execPath', { value: ${JSON.stringify(execPath)} });
`,
  );
  const r = spawnSync(process.execPath, ['-r', preload, '-e', `require(${JSON.stringify(pkg)}); console.log('loaded')`], {
    encoding: 'utf8',
  });
  return { ok: r.status === 0 && r.stdout.includes('loaded'), stderr: r.stderr };
}

const GLIBC_LDD = '#! /bin/bash\n# ldd: GNU C Library\nTEXTDOMAIN=libc\n';
const MUSL_LDD = '#!/bin/sh\nexec /lib/ld-musl-x86_64.so.1 --list "$@"\n';

test('on glibc it loads the addon built here (linux-<arch>-gnu)', () => {
  const r = load({ ldd: GLIBC_LDD });
  assert.ok(r.ok, r.stderr);
});

test('on musl it asks for @sidelease/linux-<arch>-musl, told by ldd', () => {
  const r = load({ ldd: MUSL_LDD });
  assert.equal(r.ok, false);
  assert.match(r.stderr, new RegExp(`no native addon for linux-${process.arch}-musl: the package @sidelease/linux-${process.arch}-musl is not installed \\(npm installs it`));
});

test('without ldd, process.report tells musl from glibc', () => {
  const musl = load({ report: { header: {}, sharedObjects: ['/usr/bin/node', '/lib/ld-musl-aarch64.so.1'] } });
  assert.equal(musl.ok, false);
  assert.match(musl.stderr, new RegExp(`@sidelease/linux-${process.arch}-musl is not installed`));
  const glibc = load({ report: { header: { glibcVersionRuntime: '2.36' }, sharedObjects: [] } });
  assert.ok(glibc.ok, glibc.stderr);
});

test('on arm64 Linux it asks for @sidelease/linux-arm64-gnu', () => {
  const r = load({ arch: 'arm64', ldd: GLIBC_LDD });
  assert.equal(r.ok, false);
  assert.match(r.stderr, /no native addon for linux-arm64-gnu: the package @sidelease\/linux-arm64-gnu is not installed/);
});

test('on macOS the name has no C library: @sidelease/darwin-arm64, @sidelease/darwin-x64', () => {
  for (const arch of ['arm64', 'x64']) {
    const r = load({ platform: 'darwin', arch });
    assert.equal(r.ok, false);
    assert.match(r.stderr, new RegExp(`no native addon for darwin-${arch}: the package @sidelease/darwin-${arch} is not installed \\(npm installs it`));
  }
});

test('a platform no package is built for is named, with the ones that are', () => {
  const r = load({ platform: 'freebsd', arch: 'x64' });
  assert.equal(r.ok, false);
  assert.match(
    r.stderr,
    /no native addon for freebsd-x64: the package @sidelease\/freebsd-x64 is not installed \(sidelease is built for linux-x64-gnu, linux-arm64-gnu, linux-x64-musl, linux-arm64-musl, darwin-arm64, darwin-x64 only\)/,
  );
});

test("with neither ldd nor a report that says (Bun's), the runtime's program loader tells", () => {
  const dir = tmpdir();
  // The first bytes of an ELF program and its interpreter's path, as
  // PT_INTERP puts it near the start.
  const elf = (interp) => Buffer.concat([Buffer.from([0x7f, 0x45, 0x4c, 0x46]), Buffer.alloc(60), Buffer.from(interp + '\0')]);
  fs.writeFileSync(path.join(dir, 'bun-musl'), elf('/lib/ld-musl-x86_64.so.1'));
  fs.writeFileSync(path.join(dir, 'bun-glibc'), elf('/lib64/ld-linux-x86-64.so.2'));
  const bunReport = { header: {}, sharedObjects: [] };
  const musl = load({ report: bunReport, execPath: path.join(dir, 'bun-musl') });
  assert.equal(musl.ok, false);
  assert.match(musl.stderr, new RegExp(`@sidelease/linux-${process.arch}-musl is not installed`));
  const glibc = load({ report: bunReport, execPath: path.join(dir, 'bun-glibc') });
  assert.ok(glibc.ok, glibc.stderr);
});
