"""What a built binary is, read from its headers without running it.

    python packaging/inspect.py FILE [--expect-arch A] [--expect-exports HEADER]
                                    [--expect-install-name NAME] [--max-minos X.Y]
                                    [--allow-dylib PREFIX]... [--expect-interpreter PATH]
                                    [--expect-soname NAME] [--max-glibc X.Y] [--static]
                                    [--expect-symbol NAME]... [--expect-tags TAG,...]
                                    [--expect-npm FIELD=VALUE,...] [--no-glibc] [--json]

Mach-O (macOS: a `.dylib`, a `.node` addon, an executable) and ELF (Linux)
are read by their load commands and program headers. For a Mach-O file it
reports the architecture, the install name (LC_ID_DYLIB), the minimum macOS
version (LC_BUILD_VERSION or LC_VERSION_MIN_MACOSX), the libraries it loads
and the symbols it exports; for an ELF file the machine, the interpreter,
the NEEDED libraries, the SONAME and the newest glibc symbol version
it needs. Each --expect-* option turns a fact
into a check: the first that fails ends with a message naming the file and
what was found, exit 1. macOS cannot run here, so these checks are what
the macOS artifacts get (docs/platforms.md).

FILE may also be a package: a wheel (its tags, from the WHEEL file, and
the extension module in it) or an npm package tarball (its package.json's
os, cpu and libc fields, and the addon in it); the binary checks then apply
to the one binary inside.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List

MACHO_ARCH = {0x01000007: "x86_64", 0x0100000C: "arm64"}
ELF_ARCH = {62: "x86_64", 183: "aarch64"}

LC_REQ_DYLD = 0x80000000
LC_SYMTAB = 0x2
LC_LOAD_DYLIB = 0xC
LC_ID_DYLIB = 0xD
LC_LOAD_WEAK_DYLIB = 0x18 | LC_REQ_DYLD
LC_REEXPORT_DYLIB = 0x1F | LC_REQ_DYLD
LC_LAZY_LOAD_DYLIB = 0x20
LC_LOAD_UPWARD_DYLIB = 0x23 | LC_REQ_DYLD
PLATFORM_MACOS = 1
LC_VERSION_MIN_MACOSX = 0x24
LC_BUILD_VERSION = 0x32
N_EXT, N_TYPE, N_SECT, N_PEXT, N_STAB = 0x01, 0x0E, 0x0E, 0x10, 0xE0


def _version(v: int) -> str:
    return f"{v >> 16}.{(v >> 8) & 0xFF}"


def _cstr(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode()


def macho(data: bytes) -> Dict[str, Any]:
    magic, cputype, _sub, filetype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != 0xFEEDFACF:
        raise ValueError("not a 64-bit little-endian Mach-O file")
    out: Dict[str, Any] = {
        "format": "mach-o",
        "arch": MACHO_ARCH.get(cputype & 0xFFFFFFFF, hex(cputype)),
        "filetype": {1: "object", 2: "executable", 6: "dylib", 8: "bundle"}.get(filetype, filetype),
        "install_name": None,
        "platform": None,
        "minos": None,
        "dylibs": [],
        "exports": [],
    }
    at = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, at)
        if cmd == LC_ID_DYLIB:
            (name,) = struct.unpack_from("<I", data, at + 8)
            out["install_name"] = _cstr(data, at + name)
        elif cmd in (LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_LAZY_LOAD_DYLIB,
                     LC_LOAD_UPWARD_DYLIB):
            (name,) = struct.unpack_from("<I", data, at + 8)
            out["dylibs"].append(_cstr(data, at + name))
        elif cmd == LC_BUILD_VERSION:
            platform, minos = struct.unpack_from("<II", data, at + 8)
            out["minos"] = _version(minos)
            out["platform"] = "macos" if platform == PLATFORM_MACOS else platform
        elif cmd == LC_VERSION_MIN_MACOSX:
            (minos,) = struct.unpack_from("<I", data, at + 8)
            out["minos"] = _version(minos)
            out["platform"] = "macos"
        elif cmd == LC_SYMTAB:
            symoff, nsyms, stroff, _strsize = struct.unpack_from("<IIII", data, at + 8)
            for i in range(nsyms):
                strx, ntype, _sect, _desc, _value = struct.unpack_from("<IBBhQ", data, symoff + 16 * i)
                # Exported: external, not private-extern, defined in a
                # section, not a debugging entry.
                if ntype & N_STAB == 0 and ntype & N_EXT and not ntype & N_PEXT and ntype & N_TYPE == N_SECT:
                    out["exports"].append(_cstr(data, stroff + strx).removeprefix("_"))
        at += size
    return out


def elf(data: bytes) -> Dict[str, Any]:
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (etype, machine) = struct.unpack_from("<HH", data, 16)
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    out: Dict[str, Any] = {
        "format": "elf",
        "arch": ELF_ARCH.get(machine, machine),
        "filetype": {2: "executable", 3: "shared"}.get(etype, etype),
        "interpreter": None,
        "needed": [],
        "soname": None,
        "glibc": None,
        "static": True,
    }
    loads = []
    dynamic = None
    for i in range(phnum):
        p = phoff + i * phentsize
        ptype, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, p)
        if ptype == 3:  # PT_INTERP
            out["interpreter"] = data[offset:offset + filesz].rstrip(b"\0").decode()
        elif ptype == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif ptype == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        return out
    entries = []
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        entries.append((tag, val))
    strtab = next(v for t, v in entries if t == 5)  # DT_STRTAB, an address
    stroff = next(o + strtab - va for va, o, sz in loads if va <= strtab < va + sz)
    def offset_of(addr: int) -> int:
        return next(o + addr - va for va, o, sz in loads if va <= addr < va + sz)

    for tag, val in entries:
        if tag == 1:  # DT_NEEDED
            out["needed"].append(_cstr(data, stroff + val))
        elif tag == 14:  # DT_SONAME
            out["soname"] = _cstr(data, stroff + val)
    # The newest GLIBC_x.y symbol version it needs (DT_VERNEED entries).
    verneed = dict(entries).get(0x6FFFFFFE)
    count = dict(entries).get(0x6FFFFFFF, 0)
    newest = None
    at = offset_of(verneed) if verneed else 0
    for _ in range(count):
        _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, at)
        a = at + aux
        for _ in range(cnt):
            _hash, _flags, _other, name, anext = struct.unpack_from("<IHHII", data, a)
            m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.(\d+))?", _cstr(data, stroff + name))
            if m:
                v = tuple(int(x) for x in m.groups() if x is not None)
                newest = max(newest or v, v)
            a += anext
        at += nxt
    out["glibc"] = ".".join(map(str, newest)) if newest else None
    out["static"] = not out["needed"] and out["interpreter"] is None
    return out


def inspect(path: Path) -> Dict[str, Any]:
    data = path.read_bytes()
    if data[:4] == b"PK\x03\x04" or data[:2] == b"\x1f\x8b":
        return package(path)
    return inspect_bytes(data)


def inspect_bytes(data: bytes) -> Dict[str, Any]:
    if data[:4] == b"\x7fELF":
        return elf(data)
    if data[:4] == b"\xcf\xfa\xed\xfe":
        return macho(data)
    raise ValueError("neither ELF nor Mach-O")


def package(path: Path) -> Dict[str, Any]:
    """A wheel or an npm tarball: what it declares, and its one binary's facts."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            wheel = [n for n in names if n.endswith(".dist-info/WHEEL")]
            binaries = [n for n in names if n.endswith((".so", ".dylib"))]
            if len(wheel) != 1 or len(binaries) != 1:
                raise ValueError(f"not a wheel with one extension module: {names}")
            tags = [line.split(":", 1)[1].strip() for line in z.read(wheel[0]).decode().splitlines()
                    if line.startswith("Tag:")]
            facts = inspect_bytes(z.read(binaries[0]))
            facts.update(package="wheel", binary=binaries[0], tags=tags)
            return facts
    with tarfile.open(path, "r:gz") as t:
        members = {m.name: m for m in t.getmembers() if m.isfile()}
        binaries = [n for n in members if n.endswith(".node")]
        if "package/package.json" not in members or len(binaries) != 1:
            raise ValueError(f"not an npm package with one addon: {sorted(members)}")

        def read(name: str) -> bytes:
            f = t.extractfile(members[name])
            assert f is not None
            return f.read()

        manifest = json.loads(read("package/package.json"))
        facts = inspect_bytes(read(binaries[0]))
        facts.update(package="npm", binary=binaries[0], name=manifest.get("name"),
                     npm={k: manifest.get(k) for k in ("os", "cpu", "libc")})
        return facts


def declared(header: Path) -> List[str]:
    """The functions a C header declares (`sidelease_*(`)."""
    text = header.read_text()
    return sorted(set(re.findall(r"\b(sidelease_[a-z0-9_]+)\s*\(", text)))


def newer(version: Any, limit: str) -> bool:
    """Whether dotted `version` is later than `limit`; unknown counts as later."""
    if version is None:
        return True
    return tuple(int(x) for x in version.split(".")) > tuple(int(x) for x in limit.split("."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--expect-arch")
    ap.add_argument("--expect-exports", type=Path, metavar="HEADER")
    ap.add_argument("--expect-install-name")
    ap.add_argument("--max-minos", help="the oldest macOS it must load on, e.g. 11.0")
    ap.add_argument("--allow-dylib", action="append", default=[], metavar="PREFIX",
                    help="a library it may load (prefix); any other fails")
    ap.add_argument("--expect-interpreter", help="ELF: the program loader it names")
    ap.add_argument("--expect-soname", help="ELF: the name a shared library gives itself")
    ap.add_argument("--max-glibc", help="ELF: the newest glibc symbol version it may need, e.g. 2.17")
    ap.add_argument("--static", action="store_true", help="ELF: no loader, no shared library")
    ap.add_argument("--no-glibc", action="store_true",
                    help="ELF: needs no glibc symbol version (a musl library)")
    ap.add_argument("--expect-symbol", action="append", default=[], metavar="NAME",
                    help="Mach-O: a symbol it must export (an addon's entry point)")
    ap.add_argument("--expect-tags", metavar="TAG,...", help="wheel: exactly these tags")
    ap.add_argument("--expect-npm", metavar="FIELD=VALUE,...",
                    help="npm package: os, cpu, libc (none: no such field)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        facts = inspect(a.file)
    except (OSError, ValueError, struct.error, KeyError, tarfile.TarError, zipfile.BadZipFile) as e:
        print(f"{a.file}: cannot be read as a binary: {e}", file=sys.stderr)
        return 1

    problems = []
    if a.expect_arch and facts["arch"] != a.expect_arch:
        problems.append(f"architecture is {facts['arch']}, not {a.expect_arch}")
    if a.expect_install_name and facts.get("install_name") != a.expect_install_name:
        problems.append(f"install name is {facts.get('install_name')!r}, not {a.expect_install_name!r}")
    if a.max_minos and newer(facts.get("minos"), a.max_minos):
        problems.append(f"minimum macOS is {facts.get('minos')}, newer than {a.max_minos}")
    if a.allow_dylib:
        libs = facts.get("dylibs", facts.get("needed", []))
        other = [lib for lib in libs if not any(lib.startswith(p) for p in a.allow_dylib)]
        if other:
            problems.append(f"loads {', '.join(other)}, outside {', '.join(a.allow_dylib)}")
    if a.expect_interpreter and facts.get("interpreter") != a.expect_interpreter:
        problems.append(f"program loader is {facts.get('interpreter')!r}, not {a.expect_interpreter!r}")
    if a.expect_soname and facts.get("soname") != a.expect_soname:
        problems.append(f"SONAME is {facts.get('soname')!r}, not {a.expect_soname!r}")
    # No glibc symbol version at all (a static or musl program) needs none.
    if a.max_glibc and (facts.get("format") != "elf" or (facts.get("glibc") and newer(facts["glibc"], a.max_glibc))):
        problems.append(f"needs glibc {facts.get('glibc')}, newer than {a.max_glibc}")
    if a.no_glibc and (facts.get("format") != "elf" or facts.get("glibc")):
        problems.append(f"needs glibc {facts.get('glibc')}")
    if facts.get("format") == "mach-o" and a.max_minos and facts.get("platform") != "macos":
        problems.append(f"built for platform {facts.get('platform')}, not macOS")
    if a.static and not facts.get("static"):
        problems.append(f"not static: loader {facts.get('interpreter')!r}, needs {facts.get('needed')}")
    if a.expect_exports:
        exported = set(facts.get("exports", []))
        missing = [f for f in declared(a.expect_exports) if f not in exported]
        if not facts.get("exports"):
            problems.append("exports nothing that can be read (only Mach-O symbol tables are)")
        elif missing:
            problems.append(f"does not export {', '.join(missing)} (declared in {a.expect_exports})")

    for name in a.expect_symbol:
        if name not in set(facts.get("exports", [])):
            problems.append(f"does not export {name}")
    if a.expect_tags is not None:
        want = sorted(a.expect_tags.split(","))
        if sorted(facts.get("tags", [])) != want:
            problems.append(f"wheel tags are {facts.get('tags')}, not {want}")
    if a.expect_npm is not None:
        for pair in a.expect_npm.split(","):
            field, _, value = pair.partition("=")
            want_field = None if value == "none" else [value]
            got = facts.get("npm", {}).get(field)
            if got != want_field:
                problems.append(f"package.json's {field} is {got!r}, not {want_field!r}")

    if a.json:
        shown = dict(facts)
        shown["exports"] = len(facts.get("exports", []))
        print(json.dumps(shown))
    for p in problems:
        print(f"{a.file}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
