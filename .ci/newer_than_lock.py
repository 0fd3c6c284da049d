"""Prints the installed distributions whose version differs from a lock file's pin (CI's newest
run says what it tests beyond the locked run). Usage: python .ci/newer_than_lock.py LOCKFILE"""

import importlib.metadata
import re
import sys

pins = {}
for line in open(sys.argv[1]):
    found = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
    if found:
        pins[re.sub(r"[-_.]+", "-", found[1]).lower()] = found[2]
changed = []
for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    if name in pins and pins[name] != dist.version:
        changed.append(f"  {name} {pins[name]} -> {dist.version}")
print(f"newest run: {len(changed)} distribution(s) differ from {sys.argv[1]}")
print("\n".join(sorted(changed)))
