"""libuvm.so exports only uvm_* symbols and carries a versioned soname."""
import subprocess
import sys

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
for problem in problems:
    print("FAIL:", problem)
if not problems:
    print(f"{len(names)} exported symbols, all uvm_*; {soname[0].split()[-1]}")
    print("All tests passed (exports)")
sys.exit(1 if problems else 0)
