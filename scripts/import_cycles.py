#!/usr/bin/env python3
"""Import cycles between the files of every crate of the repository: no two files may import each
other in a loop, whether through `use crate::…`, `super::…`, a child module's name or a path written
in an expression (`real::get(…)`). Prints each loop with one reference per arrow (file:line and the
path written there); exit 1 if there is one. `make lint` runs it.

Every Cargo.toml under the repository (target/ and hidden folders left out) gives its crate roots:
the library, the binaries, integration tests, benches, examples, build.rs. From each root the module
tree is followed (`mod x;`, `#[path]`, inline `mod x { … }`), each path is resolved through child
modules, items, `use` aliases and globs (re-exports followed to the file that defines the item), and
a reference is an arrow from the file it is written in to the file of the module it lands in. Paths
that land outside the crate (std, dependencies, the workspace's other crates) are not arrows. A
`mod x;` declaration is not an arrow; the parent using the child's items is. Arrows written only in
`#[cfg(test)]` modules are marked [test].

Usage: scripts/import_cycles.py [--graph] [PATH...]
  PATH     only crates whose root file lies under PATH (e.g. `shim`, `src/lib.rs`); default: all
  --graph  print every arrow of the selected crates, not only the loops
"""
import os
import re
import sys
import tomllib

SKIP_DIRS = {"target", "node_modules"}
ITEM_KEYWORDS = {"fn", "struct", "enum", "const", "static", "type", "trait", "union"}
PATH_HEADS = {"crate", "$crate", "super", "self"}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"[0-9][0-9A-Za-z_]*(?:\.[0-9][0-9A-Za-z_]*)?")
RAW_STRING = re.compile(r"(?:r|br|cr)(#*)\"")
DOLLAR_CRATE = re.compile(r"\$crate\b")

# ---------------------------------------------------------------------------------------------
# Lexing: identifiers, `::`, punctuation and string literals (for `#[path = "…"]`), with line
# numbers; comments, char literals, lifetimes and numbers dropped.


def lex(text):
    toks = []
    i, n, line = 0, len(text), 1

    def skip_string(j, raw_hashes):
        # j is just past the opening quote; returns (index past the closing quote, newlines)
        if raw_hashes is None:
            k = j
            while k < n and text[k] != '"':
                k += 2 if text[k] == "\\" else 1
            return k + 1, text.count("\n", j, k)
        end = '"' + "#" * raw_hashes
        k = text.find(end, j)
        k = n if k < 0 else k
        return k + len(end), text.count("\n", j, k)

    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            k = text.find("\n", i)
            i = n if k < 0 else k
        elif text.startswith("/*", i):
            depth, k = 1, i + 2
            while k < n and depth:
                if text.startswith("/*", k):
                    depth, k = depth + 1, k + 2
                elif text.startswith("*/", k):
                    depth, k = depth - 1, k + 2
                else:
                    k += 1
            line += text.count("\n", i, k)
            i = k
        elif c == '"':
            k, nl = skip_string(i + 1, None)
            toks.append(("str", text[i + 1 : k - 1], line))
            line += nl
            i = k
        elif c == "'":
            if i + 1 < n and text[i + 1] == "\\":
                k = text.find("'", i + 3)
                i = n if k < 0 else k + 1
            elif i + 2 < n and text[i + 2] == "'":
                i += 3
            else:
                m = IDENT.match(text, i + 1)
                i = m.end() if m else i + 1
        elif c.isdigit():
            i = NUMBER.match(text, i).end()
        elif c.isalpha() or c == "_":
            m = IDENT.match(text, i)
            word, k = m.group(0), m.end()
            raw = RAW_STRING.match(text, i) if word in ("r", "br", "cr") else None
            if raw:
                k, nl = skip_string(raw.end(), len(raw.group(1)))
                line += nl
                i = k
            elif word in ("b", "c") and k < n and text[k] == '"':
                k, nl = skip_string(k + 1, None)
                line += nl
                i = k
            elif word == "b" and k < n and text[k] == "'":
                k2 = k + 1
                while k2 < n and text[k2] != "'":
                    k2 += 2 if text[k2] == "\\" else 1
                i = k2 + 1
            elif word == "r" and k < n and text[k] == "#" and IDENT.match(text, k + 1):
                m = IDENT.match(text, k + 1)
                toks.append(("id", m.group(0), line))
                i = m.end()
            else:
                toks.append(("id", word, line))
                i = k
        elif text.startswith("::", i):
            toks.append(("::", "::", line))
            i += 2
        elif DOLLAR_CRATE.match(text, i):
            toks.append(("id", "$crate", line))
            i += 6
        else:
            toks.append(("p", c, line))
            i += 1
    return toks


# ---------------------------------------------------------------------------------------------
# Modules: one per file and per inline `mod x { … }`.


class Module:
    def __init__(self, path, file, parent, test):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.test = test
        self.children = {}
        self.items = set()
        self.aliases = {}  # name -> [segments]
        self.globs = []  # [segments]
        self.refs = []  # (segments, line, text)


def is_ident(tok):
    return tok[0] == "id"


def parse_use_tree(toks, i, prefix, out):
    """Parse one use tree at toks[i]; append (segments, alias) to out ('*' alias for a glob)."""
    segs = list(prefix)
    if toks[i][1] == "::":
        i += 1
    while True:
        t = toks[i]
        if t[1] == "{":
            i += 1
            while toks[i][1] != "}":
                i = parse_use_tree(toks, i, segs, out)
                if toks[i][1] == ",":
                    i += 1
            return i + 1
        if t[1] == "*":
            out.append((segs, "*"))
            return i + 1
        if not is_ident(t):
            return i
        name = t[1]
        i += 1
        if toks[i][1] == "::":
            segs = segs + [name]
            i += 1
            continue
        if name == "self":
            full, alias = segs, segs[-1] if segs else None
        else:
            full, alias = segs + [name], name
        if toks[i][1] == "as":
            alias = toks[i + 1][1]
            i += 2
        if alias and alias != "_" and full:
            out.append((full, alias))
        elif full:
            out.append((full, None))
        return i


def child_file(dir_, name, attr_path):
    if attr_path:
        return os.path.normpath(os.path.join(dir_, attr_path))
    for cand in (os.path.join(dir_, name + ".rs"), os.path.join(dir_, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def mod_dir(file, is_mod_rs):
    d = os.path.dirname(file)
    if is_mod_rs:
        return d
    return os.path.join(d, os.path.splitext(os.path.basename(file))[0])


def parse_file(file, path, parent, test, is_mod_rs, modules, missing):
    """Parse `file` as module `path`; recurses into its `mod x;` children."""
    try:
        text = open(file, encoding="utf-8").read()
    except OSError:
        missing.append(file)
        return None
    toks = lex(text)
    toks.append(("eof", "", 0))
    top = Module(path, file, parent, test)
    modules[path] = top
    # stack entries: (module, dir for its `mod x;` children, is a module scope)
    stack = [(top, mod_dir(file, is_mod_rs), True)]
    attrs = []
    i = 0
    while toks[i][0] != "eof":
        t = toks[i]
        mod, dir_, scope = stack[-1]
        if t[1] == "#" and toks[i + 1][1] in ("[", "!"):
            j = i + 1 + (toks[i + 1][1] == "!")
            depth, k = 0, j
            while True:
                depth += {"[": 1, "]": -1}.get(toks[k][1], 0)
                k += 1
                if depth == 0:
                    break
            attrs.append(toks[j + 1 : k - 1])
            i = k
            continue
        if t[1] == "mod" and is_ident(toks[i + 1]) and toks[i + 2][1] in (";", "{"):
            name = toks[i + 1][1]
            attr_path = None
            child_test = mod.test
            for a in attrs:
                if a and a[0][1] == "path" and len(a) >= 3 and a[2][0] == "str":
                    attr_path = a[2][1]
                if a and a[0][1] == "cfg" and any(x[1] == "test" for x in a):
                    child_test = True
            attrs = []
            cpath = mod.path + (name,)
            if toks[i + 2][1] == ";":
                f = child_file(dir_, name, attr_path)
                if f is None:
                    missing.append(os.path.join(dir_, name + ".rs"))
                else:
                    mod.children[name] = cpath
                    mod_rs = attr_path is not None or os.path.basename(f) == "mod.rs"
                    parse_file(f, cpath, mod.path, child_test, mod_rs, modules, missing)
                i += 3
            else:
                inner = Module(cpath, file, mod.path, child_test)
                modules[cpath] = inner
                mod.children[name] = cpath
                stack.append((inner, os.path.join(dir_, name), True))
                i += 3
            continue
        if t[1] == "use" and (is_ident(toks[i + 1]) or toks[i + 1][1] in ("::", "{")):
            out = []
            k = parse_use_tree(toks, i + 1, [], out)
            for segs, alias in out:
                mod.refs.append((segs, t[2], "use " + "::".join(segs)))
                if alias == "*":
                    mod.globs.append(segs)
                elif alias:
                    mod.aliases.setdefault(alias, []).append(segs)
            i = k
            continue
        if scope and t[1] in ITEM_KEYWORDS and is_ident(toks[i + 1]) and toks[i + 1][1] != "_":
            name = toks[i + 1][1]
            if name == "mut":
                name = toks[i + 2][1]
            mod.items.add(name)
        if scope and t[1] == "macro_rules" and toks[i + 1][1] == "!" and is_ident(toks[i + 2]):
            mod.items.add(toks[i + 2][1])
        if t[1] == "{":
            stack.append((mod, dir_, False))
            attrs = []
        elif t[1] == "}":
            if len(stack) > 1:
                stack.pop()
            attrs = []
        elif t[1] == ";":
            attrs = []
        starts_path = i == 0 or toks[i - 1][1] != "::"
        if is_ident(t) and toks[i + 1][1] == "::" and is_ident(toks[i + 2]) and starts_path:
            segs, k = [t[1]], i + 1
            while toks[k][1] == "::" and is_ident(toks[k + 1]):
                segs.append(toks[k + 1][1])
                k += 2
            mod.refs.append((segs, t[2], "::".join(segs)))
            i = k
            continue
        i += 1
    return top


# ---------------------------------------------------------------------------------------------
# Resolution

EXTERNAL = "external"


class Crate:
    def __init__(self, root):
        self.root = root
        self.modules = {}
        self.missing = []
        parse_file(root, (), None, False, True, self.modules, self.missing)

    def first(self, m, name, seen):
        """What `name` means inside module m: ('mod', path), ('item', path), EXTERNAL, or None."""
        mod = self.modules[m]
        if name in mod.children:
            return ("mod", mod.children[name])
        if name in mod.items:
            return ("item", m)
        if name in mod.aliases:
            for segs in mod.aliases[name]:
                r = self.resolve(m, segs, seen)
                if r is not None:
                    return r
            return EXTERNAL
        for g in mod.globs:
            r = self.resolve(m, g, seen)
            if r and r != EXTERNAL and r[0] == "mod" and r[1] != m:
                r2 = self.first(r[1], name, seen)
                if r2 is not None:
                    return r2
        return None

    def resolve(self, m, segs, seen):
        key = (m, tuple(segs))
        if key in seen:
            return None
        seen = seen | {key}
        head, rest = segs[0], segs[1:]
        if head in ("crate", "$crate"):
            cur = ()
        elif head in ("super", "self"):
            cur = m
            while head in ("super", "self"):
                if head == "super":
                    cur = self.modules[cur].parent
                    if cur is None:
                        return EXTERNAL
                if not rest:
                    return ("mod", cur)
                head, rest = rest[0], rest[1:]
            rest = [head] + rest
        else:
            r = self.first(m, head, seen)
            if r is None or r == EXTERNAL:
                return EXTERNAL
            if r[0] == "item":
                return r
            cur = r[1]
        for seg in rest:
            r = self.first(cur, seg, seen)
            if r == EXTERNAL:
                return EXTERNAL
            if r is None:
                return ("item", cur)
            if r[0] == "item":
                return r
            cur = r[1]
        return ("mod", cur)

    def edges(self):
        """{(from file, to file): [(line, text, test)]}"""
        out = {}
        for m, mod in self.modules.items():
            for segs, line, text in mod.refs:
                r = self.resolve(m, segs, frozenset())
                if r is None or r == EXTERNAL:
                    continue
                target = self.modules[r[1]].file
                if target != mod.file:
                    out.setdefault((mod.file, target), []).append((line, text, mod.test))
        return out


def cycles(graph):
    """Strongly connected components of {node: {node it points to}} with more than one node
    (Tarjan), each sorted."""
    index, low, on, stack, comps = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def shortest_loop(comp, edges):
    """One shortest loop through the first file of a component: [a, b, …, a] (breadth first)."""
    inside, start = set(comp), comp[0]
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for b in sorted(b for a, b in edges if a == v and b in inside):
            if b == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if b not in prev:
                prev[b] = v
                queue.append(b)
    return comp


# ---------------------------------------------------------------------------------------------
# Crate roots of every package


def package_roots(manifest):
    d = os.path.dirname(manifest)
    try:
        doc = tomllib.load(open(manifest, "rb"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    if "package" not in doc:
        return []
    roots = []

    def add(rel):
        p = os.path.normpath(os.path.join(d, rel))
        if os.path.isfile(p) and p not in roots:
            roots.append(p)

    add(doc.get("lib", {}).get("path", "src/lib.rs"))
    build = doc["package"].get("build", "build.rs")
    add(build if isinstance(build, str) else "build.rs")
    for kind in ("bin", "test", "bench", "example"):
        for t in doc.get(kind, []):
            if "path" in t:
                add(t["path"])
    add("src/main.rs")
    for folder in ("src/bin", "tests", "benches", "examples"):
        full = os.path.join(d, folder)
        if not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            if name.endswith(".rs"):
                add(os.path.join(folder, name))
            elif os.path.isfile(os.path.join(full, name, "main.rs")):
                add(os.path.join(folder, name, "main.rs"))
    return roots


def all_roots(top):
    roots = []
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
        if "Cargo.toml" in files:
            roots += package_roots(os.path.join(dirpath, "Cargo.toml"))
    return roots


def arrow(a, b, refs):
    """`a:line -> b  (path written there)`, [test] when only test code writes it."""
    line, text, _ = refs[0]
    test = " [test]" if all(r[2] for r in refs) else ""
    return f"{a}:{line} -> {b}  ({text}){test}"


def main(argv):
    show_all = "--graph" in argv
    wanted = [os.path.normpath(a) for a in argv if a != "--graph"]

    def selected(root):
        return not wanted or any(root == w or root.startswith(w + "/") for w in wanted)

    roots = [r for r in all_roots(".") if selected(r)]
    seen_cycles, found = set(), []
    for root in roots:
        crate = Crate(root)
        for f in crate.missing:
            print(f"note: {f} (a module of {root}) not found; not checked", file=sys.stderr)
        edges = crate.edges()
        if show_all:
            for (a, b), refs in sorted(edges.items()):
                print(f"{root}: {arrow(a, b, refs)}")
        graph = {}
        for a, b in edges:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
        for comp in cycles(graph):
            key = frozenset(comp)
            if key in seen_cycles:
                continue
            seen_cycles.add(key)
            found.append((root, comp, edges))
    for root, comp, edges in found:
        print(f"import cycle in the crate of {root}: {', '.join(comp)}")
        print(f"  shortest loop: {' -> '.join(shortest_loop(comp, edges))}")
        inside = set(comp)
        for (a, b), refs in sorted(edges.items()):
            if a in inside and b in inside:
                print(f"  {arrow(a, b, refs)}")
    if found:
        sys.exit(1)
    print(f"import cycles: none between the files of {len(roots)} crate roots")


if __name__ == "__main__":
    main(sys.argv[1:])
