#!/usr/bin/env python3
"""Import direction check inside crates/core (the crate graph holds the layers above it): every
`crate::X` reference between top-level modules must point down the layers named in
crates/core/src/lib.rs (ground → formats → inventory → allocation → plan). Prints every upward or same-layer-cyclic arrow and any import cycle; exit 1 if there is one.
The modules core re-exports from the crates below it (`text` from gpufence-ground; `cdi`,
`kubelet` from gpufence-records; `ldso` from gpufence-ldso; `quota` from gpufence-format) sit under
all of core by the crate graph and are not listed here.

Usage: scripts/layers.py [--graph]   (run from the repository root; `make lint` runs it)
"""
import os
import re
import sys

from import_cycles import cycles  # scripts/import_cycles.py: strongly connected components

SRC = "crates/core/src"
# Lower index = lower layer. A module may import modules of its own layer or below, never above;
# within a layer, the graph must still be acyclic.
LAYERS = [
    # config, errors and exit codes, text rules, atomic writes, hashing, logging, child processes
    ("ground", ["config", "exit", "fsutil", "fnv", "logging", "child", "real_runtime"]),
    # formats core still parses itself: quantities (CDI, ld.so cache and ELF, kubelet's records
    # are the crates below core)
    ("formats", ["quantity"]),
    # what the node has (NVML, device nodes, driver files), cached
    ("inventory", ["inventory"]),
    # what the scheduler decided, any dialect, backed by kubelet's record
    ("allocation", ["allocation"]),
    # the edits: pure and final (the quota backend and MPS are parts of the decision)
    ("plan", ["plan", "backend", "mps"]),
]

REF = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\}", re.S)


def top_modules():
    mods = []
    for name in sorted(os.listdir(SRC)):
        p = os.path.join(SRC, name)
        # testing.rs: the unit tests' fixtures (cfg(test) / feature "testing"), above everything
        if name in ("lib.rs", "bin", "testing.rs"):
            continue
        if name.endswith(".rs"):
            mods.append(name[:-3])
        elif os.path.isdir(p):
            mods.append(name)
    return mods


def files_of(mod):
    p = os.path.join(SRC, mod)
    if os.path.isdir(p):
        for root, _, files in os.walk(p):
            for f in files:
                if f.endswith(".rs"):
                    yield os.path.join(root, f)
    else:
        yield p + ".rs"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def edges(mods):
    out = {m: set() for m in mods}
    for m in mods:
        for f in files_of(m):
            text = strip_comments(open(f, encoding="utf-8").read())
            found = set(REF.findall(text))
            for group in USE_GROUP.findall(text):
                for item in re.split(r",(?![^{]*\})", group):
                    head = item.strip().split("::")[0].strip()
                    if head:
                        found.add(head)
            for t in found:
                if t in out and t != m:
                    out[m].add(t)
    return out


def main():
    mods = top_modules()
    layer_of = {}
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            layer_of[name] = i
    graph = edges(mods)
    bad = []
    for m in mods:
        if m not in layer_of:
            bad.append(f"src/{m}: not in any layer of scripts/layers.py (add it where it belongs)")
    for m in mods:
        for t in sorted(graph[m]):
            if m in layer_of and t in layer_of and layer_of[t] > layer_of[m]:
                bad.append(
                    f"{m} ({LAYERS[layer_of[m]][0]}) imports {t} ({LAYERS[layer_of[t]][0]}): points up"
                )
    for comp in cycles(graph):
        bad.append("import cycle: " + " <-> ".join(comp))
    if "--graph" in sys.argv:
        for m in mods:
            print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"layers: {len(mods)} modules of crates/core/src, every import points down, no cycle")


if __name__ == "__main__":
    main()
