#!/usr/bin/env python3
"""The Python API reference, generated from the package's source so that it
cannot drift from the code, and the check that every public name has a
docstring.

    .venv/bin/python tests/reference/python.py --out PATH [--package DIR]

Reads DIR (default: bindings-python/python/sidelease) with `ast`, never
importing it (the native module need not be built): every name in
`__all__` of `__init__.py`, followed through `from .mod import X` to where
it is defined (a .py module, or `_native.pyi` for the native module). Writes
one Markdown page to PATH: each name's signature as written and its
docstring, and for a class each public member's.

What counts as a member of a class: methods, properties and class
attributes defined in the class itself (inherited ones are documented on
the base), not names starting with `_`, except the protocol methods
`__enter__`, `__exit__`, `__aenter__`, `__aexit__` and `__await__`, which
are listed and need a docstring like any method (what leaving the block
does is part of the API). `__init__`/`__new__` are shown in the class's
signature; the class docstring documents them. An attribute's docstring is
the string literal right after it, or the `#:` comment lines right above it
(as Sphinx reads them); that is how `__version__` is documented.

Exit status: 0 when every name and member has a docstring; 1 when any lacks
one (each listed by qualified name, e.g. `Lease.release`) or a name in
`__all__` cannot be found; the page is written either way.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple, Union

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PACKAGE = ROOT / "bindings-python" / "python" / "sidelease"

# Listed as members although they start with `_`.
PROTOCOL_DUNDERS = ("__enter__", "__exit__", "__aenter__", "__aexit__", "__await__")
# Shown in the class's signature, documented by the class docstring.
CONSTRUCTORS = ("__init__", "__new__")
WIDTH = 88

Def = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign]


@dataclass
class Module:
    path: Path
    tree: ast.Module
    lines: List[str]
    # Top-level definitions and imports, by the name they bind.
    defs: Dict[str, Def] = field(default_factory=dict)
    imports: Dict[str, Tuple[str, int, str]] = field(default_factory=dict)  # name -> (module, level, name there)


@dataclass
class Entry:
    """One documented thing: a public name or one of its members."""

    qualname: str
    signature: str
    doc: Optional[str]
    members: List["Entry"] = field(default_factory=list)


# ---------------------------------------------------------------- reading


class Package:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.modules: Dict[str, Module] = {}

    def module(self, name: str) -> Optional[Module]:
        """`name` is dotted relative to the package ("" for __init__)."""
        if name in self.modules:
            return self.modules[name]
        base = self.dir.joinpath(*name.split(".")) if name else self.dir
        candidates = [base / "__init__.py", base / "__init__.pyi"] if not name else [
            base.with_suffix(".py"), base.with_suffix(".pyi"), base / "__init__.py", base / "__init__.pyi"]
        for path in candidates:
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                mod = Module(path, ast.parse(text, str(path)), text.splitlines())
                _index(mod, name)
                self.modules[name] = mod
                return mod
        return None

    def resolve(self, modname: str, name: str, seen: Optional[Set[Tuple[str, str]]] = None) -> Optional[Tuple[Module, Def]]:
        """Where `name`, as module `modname` binds it, is defined."""
        seen = seen or set()
        if (modname, name) in seen:
            return None
        seen.add((modname, name))
        mod = self.module(modname)
        if mod is None:
            return None
        if name in mod.defs:
            return mod, mod.defs[name]
        if name in mod.imports:
            target, level, there = mod.imports[name]
            if level == 0:
                return None  # from outside the package
            parts = modname.split(".") if modname else []
            # `from .x import` in a module goes to its package; in __init__ the package is itself.
            is_package = mod.path.stem == "__init__"
            up = level - (1 if is_package else 0)
            base = parts[: len(parts) - up] if up <= len(parts) else None
            if base is None:
                return None
            dotted = ".".join(base + ([target] if target else []))
            return self.resolve(dotted, there, seen)
        return None


def _index(mod: Module, modname: str) -> None:
    for node in mod.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            mod.defs[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    mod.defs[t.id] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                mod.imports[alias.asname or alias.name] = (node.module or "", node.level, alias.name)


def all_names(mod: Module) -> List[str]:
    for node in mod.tree.body:
        targets: List[ast.expr] = []
        value: Optional[ast.expr] = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        if value is not None and any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return [str(v) for v in ast.literal_eval(value)]
    raise SystemExit(f"tests/reference/python.py: no __all__ in {mod.path}")


# -------------------------------------------------------------- docstrings


def attribute_doc(body: List[ast.stmt], index: int, lines: List[str]) -> Optional[str]:
    """The string literal right after body[index], else the `#:` comment
    lines right above it."""
    if index + 1 < len(body):
        nxt = body[index + 1]
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            return inspect.cleandoc(nxt.value.value) or None
    comment: List[str] = []
    row = body[index].lineno - 2  # 0-based, the line above
    while row >= 0 and lines[row].strip().startswith("#:"):
        comment.insert(0, lines[row].strip()[2:].strip())
        row -= 1
    return "\n".join(comment).strip() or None


def docstring(node: Def, body: List[ast.stmt], lines: List[str]) -> Optional[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return ast.get_docstring(node, clean=True) or None
    return attribute_doc(body, body.index(node), lines)


# -------------------------------------------------------------- signatures


def _arg(a: ast.arg, default: Optional[ast.expr], prefix: str = "") -> str:
    text = prefix + a.arg
    if a.annotation is not None:
        text += ": " + ast.unparse(a.annotation)
        if default is not None:
            text += " = " + ast.unparse(default)
    elif default is not None:
        text += "=" + ast.unparse(default)
    return text


def parameters(args: ast.arguments) -> List[str]:
    out: List[str] = []
    positional = args.posonlyargs + args.args
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        out.append(_arg(a, d))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            out.append("/")
    if args.vararg is not None:
        out.append(_arg(args.vararg, None, "*"))
    elif args.kwonlyargs:
        out.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(_arg(a, d))
    if args.kwarg is not None:
        out.append(_arg(args.kwarg, None, "**"))
    return out


def _call(head: str, params: List[str], tail: str, indent: str = "") -> str:
    one = f"{indent}{head}({', '.join(params)}){tail}"
    if len(one) <= WIDTH or not params:
        return one
    inner = "".join(f"{indent}    {p},\n" for p in params)
    return f"{indent}{head}(\n{inner}{indent}){tail}"


def _decorators(node: Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef], indent: str = "") -> str:
    return "".join(f"{indent}@{ast.unparse(d)}\n" for d in node.decorator_list)


def function_signature(node: Union[ast.FunctionDef, ast.AsyncFunctionDef], indent: str = "") -> str:
    keyword = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    tail = (f" -> {ast.unparse(node.returns)}" if node.returns is not None else "") + ": ..."
    return _decorators(node, indent) + _call(f"{keyword} {node.name}", parameters(node.args), tail, indent)


def class_signature(node: ast.ClassDef) -> str:
    bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
    head = f"class {node.name}" + (f"({', '.join(bases)})" if bases else "")
    ctors = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in CONSTRUCTORS]
    if not ctors:
        return _decorators(node) + head + ": ..."
    return _decorators(node) + head + ":\n" + "\n".join(function_signature(c, "    ") for c in ctors)


def assignment_signature(node: Union[ast.Assign, ast.AnnAssign]) -> str:
    return ast.unparse(node)


def signature(node: Def) -> str:
    if isinstance(node, ast.ClassDef):
        return class_signature(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return function_signature(node)
    return assignment_signature(node)


def _annotations(node: ast.AST) -> List[ast.AST]:
    """The annotation expressions (and class bases) a signature shows."""
    out: List[ast.AST] = []
    if isinstance(node, ast.ClassDef):
        out += node.bases
        for n in node.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in CONSTRUCTORS:
                out += _annotations(n)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]:
            if arg.annotation is not None:
                out.append(arg.annotation)
        if node.returns is not None:
            out.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        out.append(node.annotation)
    return out


def aliases(mod: Module, node: ast.AST, public: Set[str]) -> List[str]:
    """`# Name = ...` lines for the module's type aliases that the signature
    names, and `# class _Name(bases)` for its private classes (a reader
    cannot look them up elsewhere)."""
    out: List[str] = []
    pending = list(_annotations(node))
    seen: Set[str] = set()
    while pending:
        for n in ast.walk(pending.pop(0)):
            names = [n.id] if isinstance(n, ast.Name) else []
            if isinstance(n, ast.Constant) and isinstance(n.value, str):  # a quoted annotation
                try:
                    names = [m.id for m in ast.walk(ast.parse(n.value, mode="eval")) if isinstance(m, ast.Name)]
                except SyntaxError:
                    names = []
            for name in names:
                d = mod.defs.get(name)
                if name in seen or name in public:
                    continue
                if isinstance(d, ast.ClassDef) and name.startswith("_"):
                    # A private class: what it is, its docstring says the rest.
                    seen.add(name)
                    bases = ", ".join(ast.unparse(b) for b in d.bases)
                    out.append(f"# class {name}" + (f"({bases})" if bases else ""))
                elif isinstance(d, (ast.Assign, ast.AnnAssign)) and d.value is not None:
                    seen.add(name)
                    out.append(f"# {name} = {ast.unparse(d.value)}")
                    pending.append(d.value)
    return out


# -------------------------------------------------------------- collecting


def with_aliases(mod: Module, node: ast.AST, public: Set[str]) -> str:
    sig = signature(node)  # type: ignore[arg-type]
    notes = aliases(mod, node, public)
    return sig + "\n\n" + "\n".join(notes) if notes else sig


def class_members(cls: ast.ClassDef, owner: str, mod: Module, public: Set[str]) -> List[Entry]:
    members: List[Entry] = []
    done: Set[str] = set()
    for i, node in enumerate(cls.body):
        name: Optional[str] = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name is None or name in done or name in CONSTRUCTORS:
            continue
        if name.startswith("_") and name not in PROTOCOL_DUNDERS:
            continue
        done.add(name)  # a property's setter, an overload: the first one
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=True) or None
        else:
            doc = attribute_doc(cls.body, i, mod.lines)
        members.append(Entry(f"{owner}.{name}", with_aliases(mod, node, public), doc))
    return members


def collect(package: Package) -> Tuple[List[Entry], List[str]]:
    init = package.module("")
    if init is None:
        raise SystemExit(f"tests/reference/python.py: no __init__.py in {package.dir}")
    names = all_names(init)
    public = set(names)
    entries: List[Entry] = []
    unresolved: List[str] = []
    for name in names:
        found = package.resolve("", name)
        if found is None:
            unresolved.append(name)
            entries.append(Entry(name, f"{name}  # not found in the source", None))
            continue
        mod, node = found
        entry = Entry(name, with_aliases(mod, node, public), docstring(node, mod.tree.body, mod.lines))
        if isinstance(node, ast.ClassDef):
            entry.members = class_members(node, name, mod, public)
        entries.append(entry)
    return entries, unresolved


# ---------------------------------------------------------------- writing

# A code span, within a paragraph (it may be broken across its lines).
_CODE_SPAN = re.compile(r"(`+)((?:(?!\n\s*\n).)+?)\1", re.S)
_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|exc|mod|data|obj):`(~?)!?([^`]+)`")


def _prose_text(text: str) -> str:
    """reST-ish inline markup to Markdown: ``x`` and :role:`x` become `x`
    (a span broken across lines joined by a space); outside code spans,
    what Markdown would read as HTML, a heading, quote or list is escaped."""
    text = _ROLE.sub(_role, text)
    text = re.sub(r"``((?:(?!\n\s*\n).)+?)``", lambda m: "`" + m.group(1) + "`", text, flags=re.S)
    out: List[str] = []
    pos = 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_escape(text[pos:m.start()]))
        out.append(m.group(1) + re.sub(r"\s*\n\s*", " ", m.group(2)) + m.group(1))
        pos = m.end()
    out.append(_escape(text[pos:]))
    return re.sub(r"^(\s*)([#>+*-]\s|\d+\.\s)", lambda m: m.group(1) + "\\" + m.group(2), "".join(out), flags=re.M)


def _role(m: "re.Match[str]") -> str:
    """:class:`x` -> `x`; :meth:`~a.b` -> `b()`, as Sphinx shows them."""
    role, short, target = m.groups()
    if short:
        target = target.rsplit(".", 1)[-1]
    if role in ("func", "meth") and not target.endswith(")"):
        target += "()"
    return f"`{target}`"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def prose(doc: str) -> str:
    """A docstring as Markdown: doctest lines (`>>>`, `...`) become a
    `pycon` block; the rest is prose."""
    out: List[str] = []
    text: List[str] = []

    def flush() -> None:
        if text:
            out.extend(_prose_text("\n".join(text)).splitlines())
            text.clear()

    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            text.append(lines[i])
            i += 1
            continue
        flush()
        block: List[str] = []
        while i < len(lines) and lines[i].lstrip().startswith((">>>", "...")):
            block.append(lines[i])
            i += 1
        if out and out[-1] != "":
            out.append("")
        out += ["```pycon", *inspect.cleandoc("\n".join(block)).splitlines(), "```"]
        if i < len(lines) and lines[i].strip():
            out.append("")
    flush()
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out)


def render(entries: List[Entry], package_shown: str) -> str:
    parts = [
        "# Python API reference",
        "",
        f"Generated from the source of `{package_shown}` (its `__all__`, signatures "
        "and docstrings, read without importing it) by `tests/reference/python.py`, "
        "which `bash tests/docs` runs; it fails when a public name or member has no "
        "docstring. Do not edit this page: change the docstrings (those of the native "
        "`Lease`, `Term`, `CancelToken`, `acquire` and `inspect` are in `_native.pyi`). "
        "Names are listed in `__all__` order, each class's members in source order.",
    ]

    def block(entry: Entry, level: str) -> None:
        parts.extend(["", f"{level} `{entry.qualname}`", "", "```python", entry.signature, "```"])
        if entry.doc:
            parts.extend(["", prose(entry.doc)])

    for entry in entries:
        block(entry, "##")
        for member in entry.members:
            block(member, "###")
    return "\n".join(parts) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the Python API reference; fail on an undocumented name.")
    parser.add_argument("--out", required=True, type=Path, help="the Markdown page to write")
    parser.add_argument("--package", type=Path, default=DEFAULT_PACKAGE,
                        help="the package's source directory (default: bindings-python/python/sidelease)")
    args = parser.parse_args(argv)
    directory = args.package.resolve()
    try:
        shown = directory.relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(directory)
    entries, unresolved = collect(Package(directory))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(entries, shown), encoding="utf-8")

    undocumented = [e.qualname for entry in entries for e in [entry, *entry.members]
                    if e.doc is None and e.qualname not in unresolved]
    for name in unresolved:
        print(f"tests/reference/python.py: `{name}` is in __all__ but defined nowhere in {shown}", file=sys.stderr)
    for name in undocumented:
        print(f"tests/reference/python.py: no docstring: {name}", file=sys.stderr)
    if unresolved or undocumented:
        print(f"tests/reference/python.py: {len(undocumented)} undocumented, {len(unresolved)} not found "
              f"(page written to {args.out})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
