#!/usr/bin/env python3
"""A simulated 8-GPU node for a bench under S (gpufence-sim), its gpufence.toml (the simulator's
file with state-dir, gpufence-binary and the [runtime], [shim], [log] tables set) and a warm
inventory cache. Usage: node_config.py S BIN_DIR RUNC [STATE_DIR]; prints the gpufence.toml path
(STATE_DIR defaults to S/state; the runtime bench puts it on a tmpfs, as /run/gpufence is).
The prepared driver folders go to S/driver-folders; DRIVER_LAYOUT=files|folders in the
environment sets runtime.driver-layout (the default: folders)."""
import os, re, subprocess, sys
s, bindir, runc = sys.argv[1:4]
state = sys.argv[4] if len(sys.argv) > 4 else f"{s}/state"
os.makedirs(f"{s}/node", exist_ok=True)
sim = subprocess.run([f"{bindir}/gpufence-sim", "node", "--dir", f"{s}/node", "--gpus", "8"],
                     check=True, capture_output=True, text=True).stdout.strip()
out = f"{s}/gpufence.toml"
text = open(sim).read()
# Drop the keys we set (top-level and the [runtime]/[shim]/[log] tables are rewritten below).
lines, skip = [], False
for l in text.splitlines():
    m = re.match(r'\s*\[([^\]]+)\]', l)
    if m:
        skip = m.group(1).strip() in ("runtime", "shim", "log")
        if skip:
            continue
    if skip or re.match(r'\s*(state-dir|gpufence-binary)\s*=', l):
        continue
    lines.append(l)
top, rest = [], []
seen_table = False
for l in lines:
    if re.match(r'\s*\[', l):
        seen_table = True
    (rest if seen_table else top).append(l)
top += [f'state-dir = "{state}"', f'gpufence-binary = "{bindir}/gpufence"']
layout = [f'driver-folders = "{s}/driver-folders"']  # beside the node, on its filesystem
if os.environ.get("DRIVER_LAYOUT"):  # runtime.driver-layout
    layout.append(f'driver-layout = "{os.environ["DRIVER_LAYOUT"]}"')
rest += ["[runtime]", f'path = "{runc}"'] + layout + ["[shim]", f'library = "{bindir}/libgpufence.so"',
         "[log]", f'file = "{s}/gpufence.log"', 'level = "info"']
open(out, "w").write("\n".join(top + rest) + "\n")
subprocess.run([f"{bindir}/gpufence", "inventory"], check=True, stdout=subprocess.DEVNULL,
               env=dict(os.environ, GPUFENCE_CONFIG=out))
print(out)
