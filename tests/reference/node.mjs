#!/usr/bin/env node
// The JavaScript API reference, generated from the public types
// (bindings-node/index.d.ts) so that it cannot drift from them, and the
// check that every public name is documented (what TypeDoc's
// validation.notDocumented does, without a dependency: the TypeScript
// compiler API from bindings-node/node_modules parses the file, no
// type-checking).
//
//   node tests/reference/node.mjs --out PATH [--input FILE]
//
// Writes one Markdown page to PATH: a `## ` section per exported name in
// source order, its declaration (comments removed) in a ts block, its JSDoc
// as prose, and a `### ` subsection per member of a class, interface, enum
// or namespace. Declarations sharing a name (function overloads, merged
// declarations) make one section with every signature in its block; it is
// documented when at least one of them has a JSDoc description, and each
// distinct JSDoc is shown. Exits 1, listing each undocumented name
// (qualified: `Lease.release`), when an exported declaration or a member has
// no JSDoc description (tags alone do not count); the page is written all
// the same. Members named by a private identifier (`#x`) are not public and
// are left out; everything else, `private constructor()` included, is
// listed and checked.
// JSDoc is what TypeScript itself attaches: a `/** ... */` block right
// before the declaration (one after a `{` on the same line is not).

import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const DEFAULT_INPUT = 'bindings-node/index.d.ts';

function usage(message) {
  process.stderr.write(`tests/reference/node.mjs: ${message}\nusage: node tests/reference/node.mjs --out PATH [--input FILE]\n`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({ options: { out: { type: 'string' }, input: { type: 'string' } }, allowPositionals: false }).values;
} catch (err) {
  usage(err.message);
}
if (!args.out) usage('--out PATH is required');

let ts;
try {
  ts = createRequire(path.join(ROOT, 'bindings-node', 'package.json'))('typescript');
} catch (err) {
  process.stderr.write(`tests/reference/node.mjs: cannot load typescript from bindings-node/node_modules (run npm ci there): ${err.message}\n`);
  process.exit(2);
}

const inputPath = path.resolve(args.input ?? path.join(ROOT, DEFAULT_INPUT));
// How the page names its source: relative to the repository when inside it.
const inputName = (() => {
  const rel = path.relative(ROOT, inputPath);
  return rel.startsWith('..') || path.isAbsolute(rel) ? inputPath : rel.split(path.sep).join('/');
})();
const text = fs.readFileSync(inputPath, 'utf8');
const sf = ts.createSourceFile(inputPath, text, ts.ScriptTarget.Latest, /* setParentNodes */ true, ts.ScriptKind.TS);

const problems = []; // undocumented names, and forms this script does not read
const sections = []; // { name, kind, nodes: [node], members: Map }

function hasModifier(node, kind) {
  return (ts.canHaveModifiers(node) ? ts.getModifiers(node) ?? [] : []).some((m) => m.kind === kind);
}

function lineOf(node) {
  return sf.getLineAndCharacterOfPosition(node.getStart(sf)).line + 1;
}

// The declaration as written, without its comments (its JSDoc, and those of
// its members): the source text from its first token to its end, each
// comment found in the trivia before or after one of its tokens cut out, a
// line left empty by that dropped, continuation lines dedented by the
// column it starts at.
function print(node) {
  const start = node.getStart(sf);
  const cuts = new Map();
  const visit = (n) => {
    for (const at of [n.pos, n.end]) {
      for (const r of [...(ts.getLeadingCommentRanges(text, at) ?? []), ...(ts.getTrailingCommentRanges(text, at) ?? [])]) {
        if (r.pos >= start && r.end <= node.end) cuts.set(r.pos, r.end);
      }
    }
    for (const c of n.getChildren(sf)) visit(c);
  };
  visit(node);
  let out = '';
  let at = start;
  for (const [pos, end] of [...cuts].sort((a, b) => a[0] - b[0])) {
    if (pos < at) continue;
    out += text.slice(at, pos) + '\u0000';
    at = end;
  }
  out += text.slice(at, node.end);
  const column = start - text.lastIndexOf('\n', start - 1) - 1;
  const kept = [];
  out.split('\n').forEach((line, i) => {
    const cut = line.includes('\u0000');
    if (cut) {
      const indent = line.match(/^[ \t]*/)[0];
      const rest = line.slice(indent.length).replace(/[ \t]*\u0000[ \t]*/g, ' ').trim();
      if (rest === '') return;
      line = indent + rest;
    }
    line = line.trimEnd();
    if (i > 0) line = line.replace(new RegExp(`^ {0,${column}}`), '');
    kept.push(line);
  });
  return kept.join('\n');
}

// The JSDoc blocks written right before a node (a variable's: before its
// statement). The last one is the node's, as TypeScript reads it.
function jsDocOf(node) {
  const docs = ts.getJSDocCommentsAndTags(node).filter((d) => d.kind === ts.SyntaxKind.JSDoc);
  return docs.length ? docs[docs.length - 1] : null;
}

function commentText(comment) {
  return (ts.getTextOfJSDocComment(comment) ?? '').trim();
}

function describe(doc) {
  if (!doc) return null;
  const tags = (doc.tags ?? []).map((t) => ({
    tag: t.tagName.text,
    name: ts.isJSDocParameterTag(t) ? t.name.getText(sf) : null,
    text: commentText(t.comment),
  }));
  return { description: commentText(doc.comment), tags };
}

function kindOf(node) {
  switch (node.kind) {
    case ts.SyntaxKind.FunctionDeclaration: return 'function';
    case ts.SyntaxKind.ClassDeclaration: return 'class';
    case ts.SyntaxKind.InterfaceDeclaration: return 'interface';
    case ts.SyntaxKind.TypeAliasDeclaration: return 'type';
    case ts.SyntaxKind.EnumDeclaration: return 'enum';
    case ts.SyntaxKind.ModuleDeclaration: return 'namespace';
    case ts.SyntaxKind.VariableDeclaration: return 'const';
    case ts.SyntaxKind.Constructor:
    case ts.SyntaxKind.ConstructSignature: return 'constructor';
    case ts.SyntaxKind.MethodDeclaration:
    case ts.SyntaxKind.MethodSignature: return 'method';
    case ts.SyntaxKind.PropertyDeclaration:
    case ts.SyntaxKind.PropertySignature: return 'property';
    case ts.SyntaxKind.GetAccessor: return 'getter';
    case ts.SyntaxKind.SetAccessor: return 'setter';
    case ts.SyntaxKind.IndexSignature: return 'index signature';
    case ts.SyntaxKind.CallSignature: return 'call signature';
    case ts.SyntaxKind.EnumMember: return 'enum member';
    default: return ts.SyntaxKind[node.kind];
  }
}

// A member's name as written: `release`, `[Symbol.dispose]`, `'stepped-down'`.
function memberName(m) {
  if (ts.isConstructorDeclaration(m) || ts.isConstructSignatureDeclaration(m)) return 'constructor';
  if (ts.isIndexSignatureDeclaration(m)) return `[${m.parameters.map((p) => p.getText(sf)).join(', ')}]`;
  if (ts.isCallSignatureDeclaration(m)) return '()';
  if (!m.name) return null;
  if (ts.isPrivateIdentifier(m.name)) return null; // #x: not public
  if (ts.isStringLiteral(m.name) && !/^[A-Za-z_$][\w$]*$/.test(m.name.text)) return `'${m.name.text}'`;
  if (ts.isStringLiteral(m.name) || ts.isNumericLiteral(m.name)) return m.name.text;
  return m.name.getText(sf);
}

function qualified(owner, name) {
  return name.startsWith('[') || name.startsWith("'") ? `${owner}${name.startsWith("'") ? `[${name}]` : name}` : `${owner}.${name}`;
}

// Members of a class, interface, enum or namespace, grouped by name in
// source order (overloads and a getter/setter pair share one entry).
function membersOf(node) {
  let list = [];
  if (ts.isClassDeclaration(node) || ts.isInterfaceDeclaration(node) || ts.isEnumDeclaration(node)) {
    list = [...node.members];
  } else if (ts.isModuleDeclaration(node) && node.body && ts.isModuleBlock(node.body)) {
    for (const s of node.body.statements) {
      if (ts.isVariableStatement(s)) list.push(...s.declarationList.declarations);
      else list.push(s);
    }
  }
  const out = new Map();
  for (const m of list) {
    if (ts.isClassStaticBlockDeclaration?.(m) || ts.isSemicolonClassElement(m)) continue;
    const name = memberName(m);
    if (name === null) continue;
    if (!out.has(name)) out.set(name, []);
    out.get(name).push(m);
  }
  return out;
}

// The exported declarations, grouped by name at their first occurrence.
const byName = new Map();
function add(name, node) {
  let s = byName.get(name);
  if (!s) {
    s = { name, nodes: [] };
    byName.set(name, s);
    sections.push(s);
  }
  s.nodes.push(node);
}

for (const st of sf.statements) {
  if (ts.isExportDeclaration(st) || ts.isExportAssignment(st)) {
    problems.push(`line ${lineOf(st)}: \`${st.getText(sf).split('\n')[0]}\`: an export form this script does not read (declare it with \`export\` instead)`);
    continue;
  }
  if (!hasModifier(st, ts.SyntaxKind.ExportKeyword)) continue;
  if (hasModifier(st, ts.SyntaxKind.DefaultKeyword)) {
    problems.push(`line ${lineOf(st)}: a default export, which this script does not read`);
    continue;
  }
  if (ts.isVariableStatement(st)) {
    for (const d of st.declarationList.declarations) add(d.name.getText(sf), d);
  } else if (st.name) {
    add(st.name.getText(sf), st);
  } else {
    problems.push(`line ${lineOf(st)}: an exported ${ts.SyntaxKind[st.kind]} without a name, which this script does not read`);
  }
}

// A declaration's text for the block: a variable with its keyword.
// (one of several in a statement: with the statement's modifiers and keyword).
function declarationText(node) {
  if (!ts.isVariableDeclaration(node)) return print(node);
  const list = node.parent;
  const statement = list.parent;
  if (list.declarations.length === 1) return print(statement);
  const keyword = list.flags & ts.NodeFlags.Const ? 'const' : list.flags & ts.NodeFlags.Let ? 'let' : 'var';
  const modifiers = (ts.getModifiers(statement) ?? []).map((m) => m.getText(sf));
  return `${[...modifiers, keyword].join(' ')} ${print(node)};`;
}

// JSDoc as Markdown prose: the description, then its tags.
function prose(docs) {
  const parts = [];
  const seen = new Set();
  for (const d of docs) {
    if (!d) continue;
    const key = JSON.stringify(d);
    if (seen.has(key)) continue;
    seen.add(key);
    if (d.description) parts.push(d.description);
    const params = d.tags.filter((t) => t.tag === 'param');
    if (params.length) {
      parts.push(['Parameters:', '', ...params.map((p) => `- \`${p.name}\`${p.text ? `: ${p.text.replace(/^-\s*/, '')}` : ''}`)].join('\n'));
    }
    for (const t of d.tags) {
      if (t.tag === 'param') continue;
      if (t.tag === 'returns' || t.tag === 'return') parts.push(`Returns: ${t.text}`);
      else if (t.tag === 'throws' || t.tag === 'exception') parts.push(`Throws: ${t.text}`);
      else if (t.tag === 'example') {
        parts.push(t.text.includes('```') ? `Example:\n\n${t.text}` : `Example:\n\n\`\`\`ts\n${t.text}\n\`\`\``);
      } else parts.push(`@${t.tag}${t.text ? ` ${t.text}` : ''}`);
    }
  }
  return parts.join('\n\n');
}

function documented(docs) {
  return docs.some((d) => d && d.description);
}

let memberCount = 0;
const lines = [
  '# JavaScript API reference (Node and Bun)',
  '',
  `This page is generated from \`${inputName}\`, the public types of the \`sidelease\` package ` +
    'for Node and Bun, by `tests/reference/node.mjs` (run by `bash tests/docs`), which fails when ' +
    'an exported name or a member of one has no JSDoc: edit the JSDoc there, not this page. ' +
    'Each exported name has a section, in the order the file declares them, with its declaration ' +
    'and then its members.',
];

for (const s of sections) {
  const docs = s.nodes.map((n) => describe(jsDocOf(n)));
  if (!documented(docs)) problems.push(`${s.name} (${kindOf(s.nodes[0])}, line ${lineOf(s.nodes[0])}): no JSDoc`);
  lines.push('', `## \`${s.name}\``, '', '```ts', s.nodes.map(declarationText).join('\n'), '```');
  const p = prose(docs);
  if (p) lines.push('', p);
  const members = new Map();
  for (const n of s.nodes) for (const [name, ms] of membersOf(n)) members.set(name, [...(members.get(name) ?? []), ...ms]);
  for (const [name, ms] of members) {
    memberCount++;
    const q = qualified(s.name, name);
    const mdocs = ms.map((m) => describe(jsDocOf(m)));
    if (!documented(mdocs)) problems.push(`${q} (${kindOf(ms[0])}, line ${lineOf(ms[0])}): no JSDoc`);
    lines.push('', `### \`${q}\``, '', '```ts', ms.map(declarationText).join('\n'), '```');
    const mp = prose(mdocs);
    if (mp) lines.push('', mp);
  }
}
lines.push('');

fs.mkdirSync(path.dirname(path.resolve(args.out)), { recursive: true });
fs.writeFileSync(args.out, lines.join('\n'));

const summary = `${sections.length} exported names, ${memberCount} members`;
if (problems.length) {
  process.stderr.write(
    `tests/reference/node.mjs: ${inputName}: ${problems.length} undocumented or unreadable (${summary}; ${args.out} written all the same):\n` +
      problems.map((p) => `  ${p}\n`).join(''),
  );
  process.exit(1);
}
process.stdout.write(`tests/reference/node.mjs: ${args.out}: ${summary}, all documented\n`);
