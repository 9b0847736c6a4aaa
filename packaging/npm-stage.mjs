// Lays out npm packages for `npm pack` (packaging/build, packaging/cross):
//   DEST/sidelease        the main package: JS, types, no binary; it loads
//                         the addon from the platform package, an optional
//                         dependency that npm installs only where it fits.
//                         It names every platform package of a release.
//   DEST/PLATFORM         @sidelease/PLATFORM (linux-x64-gnu, darwin-arm64,
//                         ...): one addon, sidelease.PLATFORM.node, alone,
//                         with the os, cpu and (on Linux) libc fields npm
//                         matches on; one per addon found in ADDONS
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [dest, version, addons] = process.argv.slice(2);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const node = path.join(root, 'bindings-node');
const main = JSON.parse(fs.readFileSync(path.join(node, 'package.json'), 'utf8'));
if (main.version !== version) throw new Error(`bindings-node/package.json says ${main.version}, Cargo.toml ${version}`);

// The release's platforms, as napi-rs names them; bindings-node/index.js
// picks one the same way.
const PLATFORMS = [
  { dir: 'linux-x64-gnu', os: 'linux', cpu: 'x64', libc: 'glibc' },
  { dir: 'linux-arm64-gnu', os: 'linux', cpu: 'arm64', libc: 'glibc' },
  { dir: 'linux-x64-musl', os: 'linux', cpu: 'x64', libc: 'musl' },
  { dir: 'linux-arm64-musl', os: 'linux', cpu: 'arm64', libc: 'musl' },
  // No libc field: npm refuses to install a package that has one on a
  // system without glibc or musl.
  { dir: 'darwin-arm64', os: 'darwin', cpu: 'arm64' },
  { dir: 'darwin-x64', os: 'darwin', cpu: 'x64' },
];
const found = fs.readdirSync(addons).filter((f) => /^sidelease\..*\.node$/.test(f));
for (const f of found) {
  if (!PLATFORMS.some((p) => f === `sidelease.${p.dir}.node`)) throw new Error(`${path.join(addons, f)}: not a platform of the release`);
}
if (found.length === 0) throw new Error(`${addons}: no sidelease.PLATFORM.node in it`);
const licenses = ['LICENSE-MIT', 'LICENSE-APACHE'];

function copy(from, toDir, name = path.basename(from)) {
  fs.copyFileSync(from, path.join(toDir, name));
}

function write(dir, pkg) {
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify(pkg, null, 2) + '\n');
}

fs.rmSync(dest, { recursive: true, force: true });
const optional = {};
for (const p of PLATFORMS) {
  const name = `@sidelease/${p.dir}`;
  optional[name] = version;
  const binary = `sidelease.${p.dir}.node`;
  if (!found.includes(binary)) continue;
  const dir = path.join(dest, p.dir);
  fs.mkdirSync(dir, { recursive: true });
  copy(path.join(addons, binary), dir);
  for (const l of licenses) copy(path.join(root, l), dir);
  fs.writeFileSync(
    path.join(dir, 'README.md'),
    `# @sidelease/${p.dir}\n\nThe native addon of [sidelease](https://www.npmjs.com/package/sidelease) for ${p.os} ${p.cpu}${p.libc ? ` (${p.libc})` : ''}.\nInstall \`sidelease\`, not this package: it is an optional dependency of it.\n`,
  );
  write(dir, {
    name,
    version,
    description: `The native addon of sidelease for ${p.os}-${p.cpu}${p.libc ? ` (${p.libc})` : ''}`,
    license: main.license,
    main: binary,
    files: [binary, ...licenses, 'README.md'],
    os: [p.os],
    cpu: [p.cpu],
    ...(p.libc ? { libc: [p.libc] } : {}),
    engines: main.engines,
    // A scoped package is private on its first publish unless it says so.
    publishConfig: { access: 'public' },
  });
}

const dir = path.join(dest, 'sidelease');
fs.mkdirSync(dir, { recursive: true });
const files = ['index.js', 'index.mjs', 'elect.js', 'index.d.ts', 'native.d.ts'];
for (const f of files) copy(path.join(node, f), dir);
for (const l of licenses) copy(path.join(root, l), dir);
copy(path.join(root, 'README.md'), dir);
const { scripts, devDependencies, napi, ...published } = main;
write(dir, { ...published, files: [...files, ...licenses, 'README.md'], optionalDependencies: optional });
