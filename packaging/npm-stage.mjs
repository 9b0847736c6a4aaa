// Lays out the two npm packages for `npm pack` (run by packaging/build):
//   DEST/sidelease        the main package: JS, types, no binary; it loads
//                         the addon from the platform package, an optional
//                         dependency that npm installs only where it fits
//   DEST/linux-x64-gnu    @sidelease/linux-x64-gnu: the addon (from ADDONS) alone, with
//                         the os, cpu and libc fields npm matches on
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [dest, version, addons] = process.argv.slice(2);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const node = path.join(root, 'bindings-node');
const main = JSON.parse(fs.readFileSync(path.join(node, 'package.json'), 'utf8'));
if (main.version !== version) throw new Error(`bindings-node/package.json says ${main.version}, Cargo.toml ${version}`);

const PLATFORMS = [{ dir: 'linux-x64-gnu', os: 'linux', cpu: 'x64', libc: 'glibc' }];
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
  const dir = path.join(dest, p.dir);
  fs.mkdirSync(dir, { recursive: true });
  const binary = `sidelease.${p.dir}.node`;
  copy(path.join(addons, binary), dir);
  for (const l of licenses) copy(path.join(root, l), dir);
  fs.writeFileSync(
    path.join(dir, 'README.md'),
    `# @sidelease/${p.dir}\n\nThe native addon of [sidelease](https://www.npmjs.com/package/sidelease) for ${p.os} ${p.cpu} (${p.libc}).\nInstall \`sidelease\`, not this package: it is an optional dependency of it.\n`,
  );
  const name = `@sidelease/${p.dir}`;
  write(dir, {
    name,
    version,
    description: `The native addon of sidelease for ${p.os}-${p.cpu} (${p.libc})`,
    license: main.license,
    main: binary,
    files: [binary, ...licenses, 'README.md'],
    os: [p.os],
    cpu: [p.cpu],
    libc: [p.libc],
    engines: main.engines,
  });
  optional[name] = version;
}

const dir = path.join(dest, 'sidelease');
fs.mkdirSync(dir, { recursive: true });
const files = ['index.js', 'index.mjs', 'elect.js', 'index.d.ts', 'native.d.ts'];
for (const f of files) copy(path.join(node, f), dir);
for (const l of licenses) copy(path.join(root, l), dir);
copy(path.join(root, 'README.md'), dir);
const { scripts, devDependencies, napi, ...published } = main;
write(dir, { ...published, files: [...files, ...licenses, 'README.md'], optionalDependencies: optional });
