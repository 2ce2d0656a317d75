#!/usr/bin/env python3
"""Checks that no AVX-512 or AMX instruction can leak from the per-ISA files into portable code.

The kernels' *_avx512.cpp, *_avx512bf16.cpp, *_amx.cpp and kernels/cpu/amx_*.cpp files are compiled
with their ISA's flags (CMakeLists.txt) and run only where CPUID says so. An inline or template
function that such a file and a portable file both emit out of line (a weak, COMDAT symbol) is one
symbol to the linker, which keeps whichever copy it meets first: if the kept copy is the ISA file's
and holds AVX-512 or AMX instructions, portable callers would run them on a CPU without them. This
script lists the weak symbols defined both in ISA-flagged and in portable object files under the
given build directory and fails, naming them, when an ISA-flagged copy holds such instructions.
Meaningful where the portable code is compiled without AVX-512 (the `portable` preset, or a native
build on an AVX2-only host); tests/CMakeLists.txt registers it there.
"""
import collections
import os
import re
import subprocess
import sys

ISA_FILE = re.compile(r"(_avx512(bf16)?|_amx)\.cpp\.o$")
AMX_KERNEL = re.compile(r"/amx_[a-z_]+\.cpp\.o$")
WIDE = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{%k|tile")


def is_isa_object(path):
    name = os.path.basename(path)
    return bool(ISA_FILE.search(name)) or (bool(AMX_KERNEL.search(path)) and "amx_tiles" not in name)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    objects = []
    for root, _, files in os.walk(build):
        if "CMakeFiles" in root and ("lattice_kernels.dir" in root or "lattice_comm.dir" in root
                                     or "lattice_core.dir" in root):
            objects += [os.path.join(root, f) for f in files if f.endswith(".o")]
    if not any(is_isa_object(o) for o in objects):
        print("check_isa_isolation: no per-ISA object files under " + build)
        return 1
    weak = collections.defaultdict(set)
    for obj in objects:
        listing = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True,
                                 check=True).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[1] in ("W", "V", "u"):
                weak[fields[2]].add(obj)
    shared = {s: objs for s, objs in weak.items()
              if any(is_isa_object(o) for o in objs) and any(not is_isa_object(o) for o in objs)}
    leaks = []
    for symbol, objs in sorted(shared.items()):
        for obj in sorted(o for o in objs if is_isa_object(o)):
            code = subprocess.run(["objdump", "-d", "--no-show-raw-insn",
                                   "--disassemble=" + symbol, obj],
                                  capture_output=True, text=True, check=True).stdout
            if WIDE.search(code):
                leaks.append((symbol, obj))
    print("check_isa_isolation: %d object files, %d weak symbols shared between per-ISA and "
          "portable files, %d with AVX-512/AMX code in a per-ISA copy"
          % (len(objects), len(shared), len(leaks)))
    for symbol, obj in leaks:
        name = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip()
        print("  leak: %s in %s" % (name, os.path.basename(obj)))
    if leaks:
        print("fix: keep such helpers out of the per-ISA files, or give them internal linkage "
              "(an anonymous namespace) there")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
