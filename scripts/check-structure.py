#!/usr/bin/env python3
"""Checks two structural rules over every Rust crate of the workspace.

1. Circles: no import circle between the files of one crate target. A
   circle means no file of it can be read, moved or split without the
   others; the files are one module in several pieces.
   For each target (a lib at src/lib.rs, each bin, each file in tests/,
   examples/ and benches/) the module tree is followed from its root through
   `mod x;` (x.rs, x/mod.rs, #[path]). File A has an edge to file B when A
   names something that B defines: a `use`/`pub use` whose path ends in B,
   a glob `use super::*` (an edge to the parent's file), or a path in code
   (`crate::b::f()`, `super::f()`, `self::m::T`, `child::f()`). Names
   re-exported with `use` are followed to the file that defines them, so
   `crate::Foo` goes to lib.rs only when lib.rs defines Foo. `mod child;`
   alone is not an edge. Comments and string literals do not count, nor
   anything under #[cfg(test)]: test modules (inline or in their own file)
   are left out and may use anything. Every strongly connected set of more
   than one file is reported, with each reference inside it as file:line.
   Method calls (`self.f()` into an `impl` in another file) cannot be seen.

2. Sizes: no source file over 800 lines before its inline tests. A file
   under src/ is counted up to its first line matching ^#\\[cfg\\(test\\)\\]
   (the whole file if none). Test-only files count whole, with a limit of
   1,000: tests.rs, *_tests.rs, anything under a tests/ folder inside src/,
   files declared by `#[cfg(test)] mod x;`, and the integration tests under
   tests/ and crates/*/tests/. Long files are hard to review and to hold in
   one head; split them by concern.

Known problems: scripts/check-structure.known lists the circles and oversize
files that existed when the check came in, one a line (`#` comments and
blank lines allowed):
    circle DIR: FILE FILE...   DIR is the target's folder as in the report
                               (relative to the root), the FILEs its files
                               relative to DIR (the set counts, not the order)
    size PATH                  PATH relative to the root
The list may only shrink. A listed problem passes; a problem not listed
fails, and so does a listed one that no longer exists (a stale line), so
fixing a problem forces removing its line. A circle whose set of files
changed is a new problem (and its old line is stale). --write-known
rewrites the file from the current tree: use it to drop fixed problems,
never to let a new one in (review its diff: only removed lines).

Usage:
    scripts/check-structure.py                 both checks (CI: scripts/test.sh)
    scripts/check-structure.py --only circles  only the import circles
    scripts/check-structure.py --only sizes    only the file sizes
    scripts/check-structure.py --root DIR      check another workspace (default:
                                               the one this script is in)
    scripts/check-structure.py --known FILE    another known-problems file (default:
                                               check-structure.known next to this
                                               script, whatever --root is)
    scripts/check-structure.py --write-known   rewrite the known file from the tree
                                               at --root, then exit 0
    scripts/check-structure.py --self-test     check the checker on a fake crate

Each new problem is one line `path:line: ...` (a circle also gets one header
line `dir: import circle N ...` listing its files), each stale known line
one line `known-file:line: stale ...`, then a summary line.
Exit status: 0 clean (only known problems), 1 new problems or stale known
lines, 2 usage or internal error (a malformed known file included).
Python 3.11+, standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

SRC_LIMIT = 800
TEST_LIMIT = 1000
CFG_TEST_LINE = re.compile(r"^#\[cfg\(test\)\]")

# ---------------------------------------------------------------- lexer

_SPECIAL = re.compile(r"""//|/\*|[bc]?r\#*"|"|'""")
_STR_BODY = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_CHAR = re.compile(r"""'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]{1,6}\}|.)|[^\\'\n])'""")
_TOKS = re.compile(r"""'[A-Za-z_]\w*|\$crate\b|r\#[A-Za-z_]\w*|[A-Za-z_]\w*|\d\w*|"\d+"|::|[^\s\w]""")


def strip(text: str) -> tuple[str, list[str]]:
    """The text with comments blanked, char literals as 0 and each string
    literal as "N" (N indexes the returned strings); lines stay in place."""
    out: list[str] = []
    strings: list[str] = []
    pos, n = 0, len(text)
    while True:
        m = _SPECIAL.search(text, pos)
        if m is None:
            out.append(text[pos:])
            break
        s, tok = m.start(), m.group()
        out.append(text[pos:s])
        if tok == "//":
            e = text.find("\n", s)
            pos = n if e < 0 else e
            out.append(" ")
        elif tok == "/*":
            depth, e = 1, s + 2
            while depth and e < n:
                if text.startswith("/*", e):
                    depth, e = depth + 1, e + 2
                elif text.startswith("*/", e):
                    depth, e = depth - 1, e + 2
                else:
                    e += 1
            out.append(" " + "\n" * text.count("\n", s, e))
            pos = e
        elif tok == "'":
            c = _CHAR.match(text, s)
            out.append(" 0 " if c else "'")
            pos = c.end() if c else s + 1
        else:
            if tok == '"':
                body = _STR_BODY.match(text, m.end())
                e = body.end() if body else n
                value = text[m.end():e - 1]
            else:  # raw string
                close = '"' + "#" * tok.count("#")
                e = text.find(close, m.end())
                e = n if e < 0 else e + len(close)
                value = text[m.end():e - len(close)]
            out.append(f' "{len(strings)}" ' + "\n" * value.count("\n"))
            strings.append(value)
            pos = e
    return "".join(out), strings


def lex(text: str) -> tuple[list[str], list[int], list[str]]:
    """Tokens of Rust source without comments, their lines, and the string
    literals (a string is one token "N", N indexing the strings)."""
    code, strings = strip(text)
    vals: list[str] = []
    lines: list[int] = []
    for ln, line in enumerate(code.split("\n"), 1):
        found = _TOKS.findall(line)
        if found:
            if "r#" in line:
                found = [v[2:] if v.startswith("r#") else v for v in found]
            vals.extend(found)
            lines.extend([ln] * len(found))
    return vals, lines, strings


def is_ident(v: str) -> bool:
    return v[0] == "_" or v[0].isalpha() or v == "$crate"


# ---------------------------------------------------------------- module tree

ITEM_KEYWORDS = {"fn", "struct", "enum", "union", "trait", "type", "const", "static"}
# Tokens before `impl`/`trait` when they start an item (not `-> impl Trait`).
ITEM_START = {";", "{", "}", "]", ")", "pub", "unsafe", "default", "auto"}
ITEMS = "items"


@dataclass(eq=False)
class Mod:
    name: str
    parent: "Mod | None"
    file: Path
    base: Path  # where `mod x;` in this module looks for x.rs / x/mod.rs
    root: "Mod | None" = None
    children: dict = field(default_factory=dict)
    items: set = field(default_factory=set)
    imports: dict = field(default_factory=dict)  # name -> path segments
    globs: list = field(default_factory=list)  # path segments of `use p::*`
    limports: dict = field(default_factory=dict)  # `use` inside fn bodies
    lglobs: list = field(default_factory=list)
    refs: list = field(default_factory=list)  # (kind, segs, line)

    def __post_init__(self) -> None:
        if self.root is None:
            self.root = self


def cfg_is_test(attr: list[str]) -> bool:
    """Whether attribute tokens (inside #[...]) are cfg(test) or cfg(all(test, ..))."""
    s = "".join(attr)
    if not s.startswith("cfg(") or not s.endswith(")"):
        return False
    inner = s[4:-1]
    if inner == "test":
        return True
    if inner.startswith("all(") and inner.endswith(")"):
        depth, part, parts = 0, "", []
        for ch in inner[4:-1]:
            if ch == "," and depth == 0:
                parts.append(part)
                part = ""
                continue
            depth += (ch == "(") - (ch == ")")
            part += ch
        parts.append(part)
        return "test" in parts
    return False


OPEN, CLOSE = {"(", "[", "{"}, {")", "]", "}"}


def match_close(vals: list[str], i: int) -> int:
    """Index of the bracket closing the one opened at vals[i]."""
    depth = 0
    for k in range(i, len(vals)):
        v = vals[k]
        if v in OPEN:
            depth += 1
        elif v in CLOSE:
            depth -= 1
            if depth == 0:
                return k
    return len(vals) - 1


def skip_item(vals: list[str], i: int, item_level: bool) -> int:
    """Index just past the item (or statement, field, arm) starting at i."""
    depth = 0
    for k in range(i, len(vals)):
        v = vals[k]
        if v in OPEN:
            depth += 1
        elif v in CLOSE:
            depth -= 1
            if depth < 0:
                return k
            if depth == 0 and v == "}":
                return k + 1
        elif depth == 0 and (v == ";" or (v == "," and not item_level)):
            return k + 1
    return len(vals)


class Target:
    """One crate target: the module tree under one root file."""

    def __init__(self, package: str, kind: str, name: str, root_file: Path, warn):
        self.package, self.kind, self.name = package, kind, name
        self.root_file = root_file
        self.warn = warn
        self.mods: list[Mod] = []
        self.test_files: set[Path] = set()  # declared by #[cfg(test)] mod x;
        self.root = self.load(None, "crate", root_file, mod_rs=True)

    @property
    def label(self) -> str:
        return f"{self.package} {self.kind}" + ("" if self.kind == "lib" else f" {self.name}")

    def load(self, parent: Mod | None, name: str, path: Path, mod_rs: bool) -> Mod:
        base = path.parent if mod_rs else path.parent / path.stem
        m = Mod(name, parent, path, base, parent.root if parent else None)
        self.mods.append(m)
        self.parse(m, *lex(path.read_text(encoding="utf-8", errors="replace")))
        return m

    def module_file(self, m: Mod, name: str, path_attr: str | None, in_file: bool):
        if path_attr is not None:
            p = (m.file.parent if in_file else m.base) / path_attr
            return (p, True) if p.is_file() else (None, False)
        for p, mod_rs in ((m.base / f"{name}.rs", False), (m.base / name / "mod.rs", True)):
            if p.is_file():
                return p, mod_rs
        return None, False

    def parse(self, top: Mod, vals: list[str], lines: list[int], strings: list[str]) -> None:
        # One entry per open '{': the Mod of a module body, ITEMS for the body
        # of an impl or trait, None for any other block.
        stack: list = [top]
        mod = top  # the innermost module
        path_attr: str | None = None
        cfg_test = False
        items_next = False  # the next '{' opens an impl or trait body
        i, n = 0, len(vals)

        def val(k: int) -> str:
            return vals[k] if k < n else ""

        def is_id(k: int) -> bool:
            return k < n and is_ident(vals[k])

        while i < n:
            v = vals[i]
            item_level = stack[-1] is not None  # items here, not statements or fields
            # attributes
            if v == "#" and (val(i + 1) == "[" or (val(i + 1) == "!" and val(i + 2) == "[")):
                inner = val(i + 1) == "!"
                o = i + 2 if inner else i + 1
                c = match_close(vals, o)
                attr = vals[o + 1:c]
                if cfg_is_test(attr):
                    if inner and len(stack) == 1:
                        top.refs.clear()  # #![cfg(test)]: a test-only file
                        self.test_files.add(top.file)
                        return
                    cfg_test = cfg_test or not inner
                elif len(attr) == 3 and attr[0] == "path" and attr[2].startswith('"'):
                    path_attr = strings[int(attr[2][1:-1])]
                i = c + 1
                continue
            if cfg_test:
                cfg_test = False
                k = i
                if val(k) == "pub":
                    k = match_close(vals, k + 1) + 1 if val(k + 1) == "(" else k + 1
                if val(k) == "mod" and is_id(k + 1) and val(k + 2) == ";":
                    p, _ = self.module_file(mod, vals[k + 1], path_attr, mod is top)
                    if p is not None:
                        self.test_files.add(p)
                path_attr = None
                i = skip_item(vals, i, item_level)
                continue
            if v == "pub":
                if val(i + 1) == "(":  # pub(crate), pub(in crate::x)
                    i = match_close(vals, i + 1) + 1
                else:
                    i += 1
                continue  # keeps path_attr for the item after
            if v == "use" and val(i + 1) != "<":  # not `impl Trait + use<'a>`
                end = i + 1
                while end < n and vals[end] != ";":
                    end += 1
                self.parse_use(mod, vals[i + 1:end], lines[i + 1:end], local=not item_level)
                path_attr = None
                i = end + 1
                continue
            if v == "mod" and is_id(i + 1) and val(i + 2) in (";", "{"):
                name = vals[i + 1]
                if val(i + 2) == ";":
                    p, mod_rs = self.module_file(mod, name, path_attr, mod is top)
                    if p is None:
                        self.warn(f"{mod.file}:{lines[i]}: file of `mod {name};` not found")
                    else:
                        mod.children[name] = self.load(mod, name, p, mod_rs)
                else:
                    child = Mod(name, mod, mod.file, mod.base / name, mod.root)
                    self.mods.append(child)
                    mod.children[name] = child
                    stack.append(child)
                    mod = child
                i += 3
                path_attr = None
                continue
            path_attr = None
            if v == "{":
                stack.append(ITEMS if items_next else None)
                items_next = False
            elif v == "}":
                if len(stack) > 1 and isinstance(stack.pop(), Mod):
                    mod = next(s for s in reversed(stack) if isinstance(s, Mod))
            elif v == ";":
                items_next = False
            elif is_ident(v):
                module_level = stack[-1] is mod
                if v in ("impl", "trait") and (i == 0 or vals[i - 1] in ITEM_START):
                    items_next = True
                elif module_level and v in ITEM_KEYWORDS and is_id(i + 1):
                    mod.items.add(vals[i + 1])
                elif module_level and v == "macro_rules" and val(i + 1) == "!" and is_id(i + 2):
                    mod.items.add(vals[i + 2])
                elif val(i + 1) == "::" and is_id(i + 2) and (i == 0 or vals[i - 1] != "::"):
                    segs, k = [v], i
                    while val(k + 1) == "::" and is_id(k + 2):
                        segs.append(vals[k + 2])
                        k += 2
                    mod.refs.append(("path", segs, lines[i]))
                    i = k + 1
                    continue
            i += 1

    def parse_use(self, mod: Mod, vals: list[str], lines: list[int], local: bool) -> None:
        imports = mod.limports if local else mod.imports
        globs = mod.lglobs if local else mod.globs
        pos, n = 0, len(vals)

        def tree(prefix: list[str]) -> None:
            nonlocal pos
            segs = list(prefix)
            if pos < n and vals[pos] == "::":
                pos += 1  # `use ::std::..`: external
                segs = ["::"]
            while pos < n:
                v = vals[pos]
                if v == "{":
                    pos += 1
                    while pos < n and vals[pos] != "}":
                        tree(segs)
                        if pos < n and vals[pos] == ",":
                            pos += 1
                    pos += 1
                    return
                if v == "*":
                    if segs and segs[0] != "::":
                        globs.append(segs)
                        mod.refs.append(("glob", segs, lines[pos]))
                    pos += 1
                    return
                if not is_ident(v):
                    pos += 1
                    return
                pos += 1
                if pos < n and vals[pos] == "::":
                    segs = segs + [v]
                    pos += 1
                    continue
                line = lines[pos - 1]
                full = segs if v == "self" else segs + [v]
                bind = full[-1] if full else v
                if pos + 1 < n and vals[pos] == "as":
                    bind = vals[pos + 1]
                    pos += 2
                if full and full[0] != "::":
                    if bind != "_":
                        imports[bind] = full
                    mod.refs.append(("use", full, line))
                return

        while pos < n:
            tree([])
            if pos < n and vals[pos] == ",":
                pos += 1


# ---------------------------------------------------------------- resolution

def lookup(m: Mod, name: str, local: bool, seen: set):
    """What `name` means inside module m: ('mod', M), ('item', M), ('extern',
    None) when imported from outside the crate, or None when not found."""
    if name in m.children:
        return ("mod", m.children[name])
    if name in m.items:
        return ("item", m)
    for imports in (m.imports, m.limports) if local else (m.imports,):
        if name in imports:
            key = (id(m), name)
            if key in seen:
                return None
            seen.add(key)
            return resolve(m, imports[name], False, seen) or ("extern", None)
    for g in m.globs + (m.lglobs if local else []):
        key = (id(m), "*", tuple(g))
        if key in seen:
            continue
        seen.add(key)
        r = resolve(m, g, False, seen)
        if r and r[0] == "mod":
            found = lookup(r[1], name, False, seen)
            if found:
                return found
    return None


def resolve(ctx: Mod, segs: list[str], local: bool = True, seen: set | None = None,
            modules_only_first: bool = False):
    """The module whose file defines what `segs` names from ctx, or None if
    it is outside the crate: ('mod'|'item'|'unknown', Mod)."""
    seen = set() if seen is None else seen
    first = segs[0]
    if first in ("crate", "$crate"):
        cur, rest = ctx.root, segs[1:]
    elif first == "self":
        cur, rest = ctx, segs[1:]
    elif first == "super":
        cur, k = ctx, 0
        while k < len(segs) and segs[k] == "super":
            cur = cur.parent
            if cur is None:
                return None
            k += 1
        rest = segs[k:]
    else:
        r = lookup(ctx, first, local, seen)
        if r is None or r[0] == "extern" or (r[0] != "mod" and modules_only_first):
            return None
        if r[0] != "mod":
            return r
        cur, rest = r[1], segs[1:]
    for s in rest:
        if s == "self":
            continue
        r = lookup(cur, s, False, seen)
        if r is None:
            return ("unknown", cur)  # e.g. made by a macro: count cur's file
        if r[0] == "extern":
            return None
        if r[0] != "mod":
            return r
        cur = r[1]
    return ("mod", cur)


@dataclass
class Circle:
    target: Target
    files: list[Path]
    edges: list  # (from, to, line, text), sorted


def target_edges(tgt: Target) -> dict:
    """{(from_file, to_file): [(line, text), ...]} of one target."""
    edges: dict = {}
    for m in tgt.mods:
        for kind, segs, line in m.refs:
            if kind == "path" and segs[0] not in ("crate", "$crate", "super", "self"):
                r = resolve(m, segs, modules_only_first=True)
            else:
                r = resolve(m, segs)
            if r is None or r[1].file == m.file:
                continue
            text = "::".join(segs)
            text = {"use": f"use {text}", "glob": f"use {text}::*"}.get(kind, text)
            edges.setdefault((m.file, r[1].file), []).append((line, text))
    return edges


def strongly_connected(nodes: list, succ: dict) -> list[list]:
    index: dict = {}
    low: dict = {}
    on, stack, out = set(), [], []
    counter = [0]

    def visit(v) -> None:  # recursion depth is bounded by the file count
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def find_circles(targets: list[Target]) -> list[Circle]:
    circles, seen = [], set()
    for tgt in targets:
        edges = target_edges(tgt)
        succ: dict = {}
        for a, b in edges:
            succ.setdefault(a, set()).add(b)
        nodes = sorted({m.file for m in tgt.mods})
        for comp in strongly_connected(nodes, {k: sorted(v) for k, v in succ.items()}):
            if len(comp) < 2 or frozenset(comp) in seen:
                continue
            seen.add(frozenset(comp))
            inside = set(comp)
            es = sorted(
                (a, b, line, text)
                for (a, b), refs in edges.items() if a in inside and b in inside
                for line, text in sorted(set(refs))
            )
            circles.append(Circle(tgt, sorted(comp), es))
    return circles


# ---------------------------------------------------------------- workspace

@dataclass
class Package:
    name: str
    dir: Path
    manifest: dict


def load_packages(root: Path) -> list[Package]:
    manifest = tomllib.loads((root / "Cargo.toml").read_text(encoding="utf-8"))
    dirs = []
    if "package" in manifest:
        dirs.append(root)
    ws = manifest.get("workspace", {})
    excluded = {(root / e).resolve() for e in ws.get("exclude", [])}
    for member in ws.get("members", []):
        for d in sorted(root.glob(member)):
            if (d / "Cargo.toml").is_file() and d.resolve() not in excluded:
                dirs.append(d)
    pkgs = []
    for d in dirs:
        m = manifest if d == root else tomllib.loads((d / "Cargo.toml").read_text(encoding="utf-8"))
        pkgs.append(Package(m.get("package", {}).get("name", d.name), d, m))
    return pkgs


def package_targets(pkg: Package, warn) -> list[Target]:
    d, m = pkg.dir, pkg.manifest
    found: list[tuple[str, str, Path]] = []
    lib = m.get("lib", {}).get("path", "src/lib.rs")
    if (d / lib).is_file():
        found.append(("lib", "lib", d / lib))
    for kind, key, folder in (("bin", "bin", "src/bin"), ("test", "test", "tests"),
                              ("example", "example", "examples"), ("bench", "bench", "benches")):
        for t in m.get(key, []):
            if "path" in t:
                found.append((kind, t.get("name", Path(t["path"]).stem), d / t["path"]))
        if kind == "bin" and (d / "src/main.rs").is_file():
            found.append(("bin", pkg.name, d / "src/main.rs"))
        f = d / folder
        if f.is_dir():
            for p in sorted(f.glob("*.rs")):
                found.append((kind, p.stem, p))
            for p in sorted(f.glob("*/main.rs")):
                found.append((kind, p.parent.name, p))
    targets, done = [], set()
    for kind, name, path in found:
        if path.resolve() in done or not path.is_file():
            continue
        done.add(path.resolve())
        targets.append(Target(pkg.name, kind, name, path, warn))
    return targets


def is_test_only_name(rel: Path) -> bool:
    """tests.rs, *_tests.rs, or under a tests/ folder inside src/."""
    parts = rel.parts
    in_src = "src" in parts
    return in_src and (rel.name == "tests.rs" or rel.name.endswith("_tests.rs")
                       or "tests" in parts[parts.index("src") + 1:-1])


def find_oversize(root: Path, pkgs: list[Package], test_decls: set[Path]) -> list:
    """[(path, line, message)] of files over their limit."""
    out = []
    test_dirs = {p.parent if p.name == "mod.rs" else p.with_suffix("") for p in test_decls}
    for pkg in pkgs:
        for folder, integration in (("src", False), ("tests", True)):
            for p in sorted((pkg.dir / folder).rglob("*.rs")):
                rel = p.relative_to(root)
                lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
                test_only = (integration or is_test_only_name(rel) or p in test_decls
                             or any(d in p.parents for d in test_dirs))
                # The line number given is the first line over the limit.
                if test_only:
                    if len(lines) > TEST_LIMIT:
                        what = "integration test" if integration else "test-only module"
                        out.append((rel, TEST_LIMIT + 1,
                                    f"{len(lines)} lines ({what}, limit {TEST_LIMIT}): split it"))
                    continue
                cut = next((k for k, s in enumerate(lines) if CFG_TEST_LINE.match(s)), len(lines))
                if cut > SRC_LIMIT:
                    where = (f"before its first #[cfg(test)] at line {cut + 1}"
                             if cut < len(lines) else "and no #[cfg(test)]")
                    out.append((rel, SRC_LIMIT + 1,
                                f"{cut} lines {where} (limit {SRC_LIMIT}): split it"))
    return out


# ---------------------------------------------------------------- known problems

KNOWN_FILE = Path(__file__).resolve().with_name("check-structure.known")
KNOWN_HEADER = """\
# Known problems for scripts/check-structure.py: the import circles and
# oversize files that existed when the check was introduced.
#
# This list may only shrink. The check fails on a problem not listed here
# AND on a listed problem that no longer exists, so that fixing one forces
# removing its line. A circle whose set of files changed counts as new (and
# its old line as stale). Do not add lines: fix new problems instead.
#
# One problem a line:
#   circle DIR: FILE FILE...  an import circle of the crate target in DIR,
#                             its files relative to DIR
#   size PATH                 a file over its size limit
# Regenerate from the tree with scripts/check-structure.py --write-known
# (then check the diff only removes lines).
"""


class KnownError(Exception):
    """A malformed known-problems file."""


def known_line(kind: str, where: str, files: list[str] | None = None) -> str:
    """The canonical line of one problem: `circle DIR: F...` or `size PATH`."""
    if kind == "circle":
        return f"circle {where}: " + " ".join(sorted(set(files or ())))
    return f"size {where}"


def parse_known(text: str, name: str) -> dict[str, int]:
    """{canonical line: line number} of a known-problems file."""
    out: dict[str, int] = {}
    for ln, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        kind, _, rest = s.partition(" ")
        rest = rest.strip()
        if kind == "circle" and ":" in rest:
            where, _, files = rest.partition(":")
            names = files.split()
            if where.strip() and " " not in where.strip() and len(set(names)) >= 2:
                line = known_line("circle", where.strip(), names)
            else:
                line = None
        elif kind == "size" and rest and len(rest.split()) == 1:
            line = known_line("size", rest)
        else:
            line = None
        if line is None:
            raise KnownError(f"{name}:{ln}: not `circle DIR: FILE FILE...` nor `size PATH`: {s}")
        if line in out:
            raise KnownError(f"{name}:{ln}: same problem as line {out[line]}: {s}")
        out[line] = ln
    return out


def read_known(path: Path | None) -> dict[str, int]:
    if path is None:
        return {}
    if not path.is_file():
        print(f"warning: no known-problems file {path}: every problem counts as new",
              file=sys.stderr)
        return {}
    return parse_known(path.read_text(encoding="utf-8"), str(path))


def render_known(lines: list[str]) -> str:
    circles = sorted(line for line in lines if line.startswith("circle "))
    sizes = sorted(line for line in lines if line.startswith("size "))
    body = "".join(f"{line}\n" for line in circles)
    if circles and sizes:
        body += "\n"
    body += "".join(f"{line}\n" for line in sizes)
    return KNOWN_HEADER + ("\n" + body if body else "")


# ---------------------------------------------------------------- main

@dataclass
class Result:
    new_circles: list  # [Circle]
    new_oversize: list  # [(path, line, message)]
    known_circles: list
    known_oversize: list
    stale: list  # [(line number, known line)]
    current: list  # known lines of every problem found

    @property
    def failed(self) -> bool:
        return bool(self.new_circles or self.new_oversize or self.stale)


def circle_base(c: Circle) -> Path:
    """The folder a circle's files are shown relative to."""
    base = c.target.root_file.parent
    if c.target.kind in ("lib", "bin") and base.name == "bin":
        base = base.parent
    return base


def run(root: Path, only: str | None, out=sys.stdout, known_path: Path | None = None,
        known_name: str | None = None) -> Result:
    """Runs the checks against the known problems in known_path (none if
    None); prints new problems and stale known lines; returns the Result."""
    root = root.resolve()
    known = read_known(known_path)
    known_name = known_name or (str(known_path) if known_path else "known")
    warnings: list[str] = []
    pkgs = load_packages(root)
    targets = [t for p in pkgs for t in package_targets(p, warnings.append)]
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    circles = find_circles(targets) if only in (None, "circles") else []
    test_decls = {f.resolve() for t in targets for f in t.test_files}
    oversize = find_oversize(root, pkgs, test_decls) if only in (None, "sizes") else []

    def rel(p: Path) -> str:
        return os.path.relpath(p, root)

    def circle_key(c: Circle) -> str:
        base = circle_base(c)
        return known_line("circle", rel(base), [os.path.relpath(f, base) for f in c.files])

    current: list[str] = []
    new_circles, known_circles, new_oversize, known_oversize = [], [], [], []
    for c in circles:
        key = circle_key(c)
        current.append(key)
        (known_circles if key in known else new_circles).append(c)
    for o in oversize:
        key = known_line("size", str(o[0]))
        current.append(key)
        (known_oversize if key in known else new_oversize).append(o)
    kinds = {"circles": ("circle ",), "sizes": ("size ",), None: ("circle ", "size ")}[only]
    found = set(current)
    stale = sorted((ln, line) for line, ln in known.items()
                   if line.startswith(kinds) and line not in found)

    for n, c in enumerate(new_circles, 1):
        base = circle_base(c)
        short = lambda p: os.path.relpath(p, base)  # noqa: E731
        print(f"{rel(base)}: import circle {n} in {c.target.label}, {len(c.files)} files"
              " (new: not in the known problems): "
              + " ".join(short(f) for f in c.files), file=out)
        for a, b, line, text in c.edges:
            print(f"{rel(a)}:{line}: circle {n}: {short(a)} -> {short(b)} ({text})", file=out)
    for path, line, msg in new_oversize:
        print(f"{path}:{line}: {msg}", file=out)
    for ln, line in stale:
        print(f"{known_name}:{ln}: stale: `{line}` is no longer found"
              " (fixed, or for a circle its files changed): remove this line", file=out)
    checked = []
    if only in (None, "circles"):
        checked.append(f"{len(new_circles)} new import circle(s) ({len(known_circles)} known)"
                       f" in {len(targets)} crate targets")
    if only in (None, "sizes"):
        checked.append(f"{len(new_oversize)} new file(s) over the size limit"
                       f" ({len(known_oversize)} known)")
    checked.append(f"{len(stale)} stale known line(s)")
    result = Result(new_circles, new_oversize, known_circles, known_oversize, stale, current)
    verdict = "FAILED" if result.failed else "OK"
    print(f"check-structure: {verdict}: " + ", ".join(checked), file=out)
    return result


def self_test() -> int:
    files = {
        "Cargo.toml": '[workspace]\nmembers = ["crates/*"]\n',
        "crates/demo/Cargo.toml": '[package]\nname = "demo"\n',
        # lib.rs: mod declarations alone are no edges; a re-export of A is
        # an edge to a.rs; names in comments and strings do not count.
        "crates/demo/src/lib.rs": (
            "//! crate::b::B in a doc comment\n"
            "mod a;\nmod b;\npub mod parent;\nmod big;\nmod plain;\nmod user;\nmod ok_len;\nmod m1;\nmod m2;\n"
            "pub use a::A;\n"
            "/* use crate::user::U; /* nested */ crate::user::x() */\n"
            "const S: &str = \"crate::user::U\";\n"
            "const R: &str = r#\"crate::user::U \"quoted\" \"#;\n"
            "const C: char = '\"';\n"
            "pub fn helper<'a>(_: &'a str) {}\n"
            "#[cfg(test)]\nmod tests;\n"
        ),
        # The known circle: a.rs -> b.rs by `use`, b.rs -> a.rs by a path in code.
        "crates/demo/src/a.rs": "use crate::b::B;\npub struct A(pub B);\n",
        "crates/demo/src/b.rs": (
            "pub struct B;\n"
            "pub fn make() -> crate::a::A {\n    crate::a::A(B)\n}\n"
        ),
        # A circle through an item made by a macro (counted in the file
        # that makes it).
        "crates/demo/src/m1.rs": (
            "macro_rules! make {\n    ($n:ident) => {\n        pub struct $n;\n    };\n}\n"
            "make!(Made);\npub fn two() -> crate::m2::Two {\n    crate::m2::Two\n}\n"
        ),
        "crates/demo/src/m2.rs": "pub struct Two;\npub fn made() -> crate::m1::Made {\n    crate::m1::Made\n}\n",
        # A glob child whose parent calls into it.
        "crates/demo/src/parent.rs": (
            "mod child;\npub struct P;\n"
            "pub fn run() -> P {\n    child::go()\n}\n"
            "mod quiet;\npub use std::time::Duration;\n"
            "fn wait() -> Duration {\n    quiet::q()\n}\n"
        ),
        # Neither pub(in path) nor a name the parent imports from outside
        # the crate is an edge to the parent.
        "crates/demo/src/parent/quiet.rs": (
            "pub(in crate::parent) fn q() -> super::Duration {\n"
            "    use std::time::Duration as D;\n    D::ZERO\n}\n"
        ),
        "crates/demo/src/parent/child.rs": "use super::*;\npub(super) fn go() -> P {\n    P\n}\n",
        # user.rs uses a re-export of lib.rs (an edge to a.rs, not lib.rs) and
        # plain.rs; plain.rs reaches back only from its test modules.
        "crates/demo/src/user.rs": (
            "use crate::A;\nuse crate::plain::{self, Plain};\n"
            "pub struct U;\n"
            "pub fn x() -> Plain {\n    crate::helper(\"\");\n    plain::new()\n}\n"
        ),
        "crates/demo/src/plain.rs": (
            "pub struct Plain;\npub fn new() -> Plain {\n    Plain\n}\n"
            "impl Plain {\n    #[cfg(test)]\n"
            "    fn generic<A, B>(_: A, _: B) -> crate::user::U {\n        crate::user::U\n    }\n"
            "    pub fn id(&self) -> impl Fn() + use<> {\n        || ()\n    }\n}\n"
            "#[cfg(test)]\nfn only_in_tests() -> crate::user::U {\n    crate::user::U\n}\n"
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::user::U;\n}\n"
            "#[cfg(test)]\n#[path = \"plain_more.rs\"]\nmod more;\n"
        ),
        # Test-only by its declaration: the whole file counts, limit 1,000.
        "crates/demo/src/plain_more.rs": "use crate::user::x;\n" + "// filler\n" * 900,
        "crates/demo/src/tests.rs": "use crate::user::*;\nuse super::*;\n",
        "crates/demo/src/big.rs": "// line\n" * 801 + "#[cfg(test)]\nmod tests {}\n",
        "crates/demo/src/ok_len.rs": "// line\n" * 800 + "#[cfg(test)]\nmod tests {\n" + "\n" * 400 + "}\n",
        "crates/demo/tests/long.rs": "// line\n" * 1001,
        # Test-only by its name: 1,000 lines at most, inline tests or not.
        "crates/demo/src/long_tests.rs": "// line\n" * 1001,
        "crates/demo/src/a/tests/fine.rs": "// line\n" * 1000,
        "crates/demo/tests/short.rs": "mod common;\nuse common::*;\n" + "// line\n" * 900,
        "crates/demo/tests/common/mod.rs": "pub fn shared() {}\n",
        # A clean crate with a lib and a bin; the bin has a circle of its own.
        "crates/clean/Cargo.toml": '[package]\nname = "clean"\n',
        "crates/clean/src/lib.rs": "mod x;\npub fn helper() {}\n",
        "crates/clean/src/x.rs": "pub struct X;\nfn f() {\n    crate::helper();\n}\n",
        "crates/clean/src/main.rs": "mod cli;\nfn run() {}\nfn main() {\n    cli::parse();\n}\n",
        "crates/clean/src/cli.rs": "pub(crate) fn parse() {\n    super::run();\n}\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        import io
        buf = io.StringIO()
        res = run(root, None, out=buf)
        circles, oversize = res.new_circles, res.new_oversize
        got = {frozenset(str(f.relative_to(root)) for f in c.files) for c in circles}
        want = {
            frozenset({"crates/demo/src/a.rs", "crates/demo/src/b.rs"}),
            frozenset({"crates/demo/src/parent.rs", "crates/demo/src/parent/child.rs"}),
            frozenset({"crates/clean/src/main.rs", "crates/clean/src/cli.rs"}),
            frozenset({"crates/demo/src/m1.rs", "crates/demo/src/m2.rs"}),
        }
        problems = []
        if got != want:
            problems.append(f"circles: got {sorted(map(sorted, got))}, want {sorted(map(sorted, want))}")
        edges = {(os.path.relpath(a, root), os.path.relpath(b, root), line, text)
                 for c in circles for a, b, line, text in c.edges}
        want_edges = {
            ("crates/demo/src/a.rs", "crates/demo/src/b.rs", 1, "use crate::b::B"),
            ("crates/demo/src/b.rs", "crates/demo/src/a.rs", 2, "crate::a::A"),
            ("crates/demo/src/b.rs", "crates/demo/src/a.rs", 3, "crate::a::A"),
            ("crates/demo/src/parent.rs", "crates/demo/src/parent/child.rs", 4, "child::go"),
            ("crates/demo/src/parent/child.rs", "crates/demo/src/parent.rs", 1, "use super::*"),
            ("crates/clean/src/main.rs", "crates/clean/src/cli.rs", 4, "cli::parse"),
            ("crates/clean/src/cli.rs", "crates/clean/src/main.rs", 2, "super::run"),
            ("crates/demo/src/m1.rs", "crates/demo/src/m2.rs", 7, "crate::m2::Two"),
            ("crates/demo/src/m1.rs", "crates/demo/src/m2.rs", 8, "crate::m2::Two"),
            ("crates/demo/src/m2.rs", "crates/demo/src/m1.rs", 2, "crate::m1::Made"),
            ("crates/demo/src/m2.rs", "crates/demo/src/m1.rs", 3, "crate::m1::Made"),
        }
        if edges != want_edges:
            problems.append(f"edges: got {sorted(edges)}, want {sorted(want_edges)}")
        got_sizes = {(str(p), line) for p, line, _ in oversize}
        want_sizes = {("crates/demo/src/big.rs", 801), ("crates/demo/tests/long.rs", 1001),
                      ("crates/demo/src/long_tests.rs", 1001)}
        if got_sizes != want_sizes:
            problems.append(f"sizes: got {sorted(got_sizes)}, want {sorted(want_sizes)}")
        if not buf.getvalue().rstrip().splitlines()[-1].startswith("check-structure: FAILED"):
            problems.append("summary line missing")
        problems += known_self_test(root, res.current)
    for p in problems:
        print(f"self-test: {p}", file=sys.stderr)
    print("self-test: " + ("FAILED" if problems else "OK"))
    return 1 if problems else 0


def known_self_test(root: Path, current: list[str]) -> list[str]:
    """The known-problems file on the fake workspace at root, whose problems
    (as known lines) are `current`."""
    problems: list[str] = []
    want_lines = {
        "circle crates/demo/src: a.rs b.rs",
        "circle crates/demo/src: m1.rs m2.rs",
        "circle crates/demo/src: parent.rs parent/child.rs",
        "circle crates/clean/src: cli.rs main.rs",
        "size crates/demo/src/big.rs",
        "size crates/demo/tests/long.rs",
        "size crates/demo/src/long_tests.rs",
    }
    if set(current) != want_lines:
        problems.append(f"known lines: got {sorted(current)}, want {sorted(want_lines)}")
    known = root / "check-structure.known"

    def check(name: str, text: str, only: str | None = None, new_circles: set = frozenset(),
              new_sizes: set = frozenset(), stale: set = frozenset()) -> None:
        import io
        known.write_text(text)
        buf = io.StringIO()
        try:
            r = run(root, only, out=buf, known_path=known)
        except KnownError as e:
            problems.append(f"known file, {name}: {e}")
            return
        got = (
            {" ".join(os.path.relpath(f, root) for f in c.files) for c in r.new_circles},
            {str(o[0]) for o in r.new_oversize},
            {line for _, line in r.stale},
        )
        want = (set(new_circles), set(new_sizes), set(stale))
        if got != want:
            problems.append(f"known file, {name}: got new circles, new sizes, stale {got},"
                            f" want {want}")
        verdict = "FAILED" if any(want) else "OK"
        if not buf.getvalue().rstrip().splitlines()[-1].startswith(f"check-structure: {verdict}"):
            problems.append(f"known file, {name}: summary line not {verdict}")

    full = render_known(current)
    # As --write-known writes it: every problem listed passes.
    check("all listed", full)
    # Listed in another order, with comments, blanks and extra spaces: the same.
    check("listed loosely",
          "# comment\n\n  circle crates/demo/src:   b.rs a.rs  \n"
          "circle crates/demo/src: m2.rs m1.rs\n"
          "circle crates/demo/src: parent/child.rs parent.rs\n"
          "circle crates/clean/src: main.rs cli.rs\n"
          "size crates/demo/src/big.rs\nsize crates/demo/tests/long.rs\n"
          "size crates/demo/src/long_tests.rs\n")
    # An unlisted circle or file fails.
    check("circle not listed", full.replace("circle crates/clean/src: cli.rs main.rs\n", ""),
          new_circles={"crates/clean/src/cli.rs crates/clean/src/main.rs"})
    check("size not listed", full.replace("size crates/demo/src/big.rs\n", ""),
          new_sizes={"crates/demo/src/big.rs"})
    # A line whose problem is gone fails, circle or size.
    gone = "circle crates/demo/src: gone.rs lib.rs"
    check("stale circle", full + gone + "\n", stale={gone})
    check("stale size", full + "size crates/demo/src/ok_len.rs\n",
          stale={"size crates/demo/src/ok_len.rs"})
    # A circle listed with another set of files: new, and its line stale.
    more = "circle crates/demo/src: a.rs b.rs lib.rs"
    check("circle with other files", full.replace("circle crates/demo/src: a.rs b.rs\n", more + "\n"),
          new_circles={"crates/demo/src/a.rs crates/demo/src/b.rs"}, stale={more})
    fewer = "circle crates/demo/src: parent.rs"
    try:
        parse_known(fewer + "\n", "known")
        problems.append("known file: a circle of one file was accepted")
    except KnownError:
        pass
    # --only: the lines of the other check are neither used nor stale.
    check("only circles", full + "size crates/demo/src/ok_len.rs\n", only="circles")
    check("only sizes", full + gone + "\n", only="sizes")
    # Malformed lines and duplicates are errors, not problems.
    for bad in ("circle crates/demo/src a.rs b.rs", "sizes crates/demo/src/big.rs",
                "size a.rs b.rs", "size crates/demo/src/big.rs\nsize  crates/demo/src/big.rs",
                "circle crates/demo/src: a.rs b.rs\ncircle crates/demo/src: b.rs a.rs"):
        try:
            parse_known(bad + "\n", "known")
            problems.append(f"known file: malformed text accepted: {bad!r}")
        except KnownError:
            pass
    # --write-known's text parses back to the same problems.
    if set(parse_known(full, "known")) != set(current):
        problems.append("known file: --write-known text does not parse back")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("circles", "sizes"))
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--known", type=Path, default=KNOWN_FILE)
    ap.add_argument("--write-known", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.write_known and args.only:
        ap.error("--write-known writes both checks' problems: leave out --only")
    try:
        if args.self_test:
            return self_test()
        if args.write_known:
            import io
            res = run(args.root, None, out=io.StringIO(), known_path=None)
            args.known.write_text(render_known(res.current), encoding="utf-8")
            print(f"check-structure: wrote {len(res.current)} known problem(s) to {args.known}")
            return 0
        res = run(args.root, args.only, known_path=args.known)
    except KnownError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception:  # a bug here, not a problem in the code checked
        import traceback
        traceback.print_exc()
        return 2
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
