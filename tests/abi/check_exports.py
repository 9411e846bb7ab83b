"""libuvm.so exports only uvm_* symbols and carries a versioned soname; every exported symbol and
every struct and enum of uvm.h is named in docs/c-api.md (with the source root as second argument)."""
import re
import subprocess
import sys
from pathlib import Path

library = sys.argv[1]
symbols = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True,
                         text=True).stdout.split("\n")
names = [line.split()[-1] for line in symbols if line.strip()]
foreign = [name for name in names if not name.startswith("uvm_")]
dynamic = subprocess.run(["readelf", "-d", library], check=True, capture_output=True, text=True).stdout
soname = [line for line in dynamic.splitlines() if "(SONAME)" in line]

problems = []
if foreign:
    problems.append(f"symbols other than uvm_*: {foreign}")
if len(names) < 20:
    problems.append(f"only {len(names)} uvm_* symbols: {names}")
if not soname or "libuvm.so.0" not in soname[0]:
    problems.append(f"soname is not libuvm.so.0: {soname}")
if len(sys.argv) > 2:
    root = Path(sys.argv[2])
    documented = set(re.findall(r"`(uvm_[a-z0-9_]+)", (root / "docs" / "c-api.md").read_text()))
    header = (root / "include" / "uvm.h").read_text()
    types = re.findall(r"^typedef (?:enum|struct) (uvm_[a-z0-9_]+)", header, re.MULTILINE)
    undocumented = sorted(set(names + types) - documented)
    if undocumented:
        problems.append(f"not named in docs/c-api.md: {undocumented}")
    if len(types) < 10:
        problems.append(f"only {len(types)} types found in uvm.h: {types}")
for problem in problems:
    print("FAIL:", problem)
if not problems:
    print(f"{len(names)} exported symbols, all uvm_*, all documented; {soname[0].split()[-1]}")
    print("All tests passed (exports)")
sys.exit(1 if problems else 0)
