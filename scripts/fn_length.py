#!/usr/bin/env python3
"""No function of src/, crates/ (and the shim's, the formats crate's) over LIMIT lines (default 150): each
`fn` from its signature to its closing brace at the same indentation. `make lint` runs it.

Usage: scripts/fn_length.py [LIMIT]   (from the repository root; exit 1 naming each long one)
"""
import os
import re
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 150
FN = re.compile(r'^(\s*)(pub(\([a-z]+\))? )?(const )?(async )?(unsafe )?(extern "C" )?fn (\w+)')


def main():
    long = []
    for root in ("src", "crates", "shim/src", "format/src"):
        for dirpath, _, files in os.walk(root):
            for f in sorted(files):
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, f)
                lines = open(path, encoding="utf-8").read().split("\n")
                for i, line in enumerate(lines):
                    m = FN.match(line)
                    if not m or line.rstrip().endswith(";"):
                        continue
                    end = m.group(1) + "}"
                    for j in range(i + 1, len(lines)):
                        if lines[j] == end:
                            if j - i + 1 > LIMIT:
                                long.append(f"{path}:{i + 1}: fn {m.group(8)} is {j - i + 1} lines (limit {LIMIT})")
                            break
    if long:
        print("\n".join(long))
        sys.exit(1)
    print(f"fn length: every function of src/, crates/, shim/src, format/src within {LIMIT} lines")


if __name__ == "__main__":
    main()
