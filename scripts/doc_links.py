#!/usr/bin/env python3
"""Check the repository's Markdown links: every relative link names a file that exists, and
every `#anchor` (in the same file or another .md file) names a heading there, as GitHub
renders heading anchors. Web links (http, https, mailto) are not followed.

Usage: python3 scripts/doc_links.py [ROOT]   (exit 1 and one line per broken link)
"""

import os
import re
import sys

LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SKIP_DIRS = {".git", "target", "node_modules", ".venv", "venv"}


def anchors(path):
    """The anchors GitHub gives the headings of a Markdown file."""
    seen, out = {}, set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if in_fence or not m:
                continue
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path):
    """(line number, target) of every inline link outside code fences and code spans."""
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield n, m.group(1)


def check(root):
    cache, broken = {}, []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(d, name)
            for n, target in links(path):
                if re.match(r"^[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(d, file)) if file else path
                where = f"{os.path.relpath(path, root)}:{n}: {target}"
                if not os.path.exists(dest):
                    broken.append(f"{where}: no such file")
                elif anchor and dest.endswith(".md"):
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        broken.append(f"{where}: no heading with that anchor")
    return broken


if __name__ == "__main__":
    broken = check(sys.argv[1] if len(sys.argv) > 1 else ".")
    for b in broken:
        print(b)
    sys.exit(1 if broken else 0)
