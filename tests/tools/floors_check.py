#!/usr/bin/env python3
"""floors_check.py ROOT: core's includes run one way, as core/README.md's table of floors says.

Every room of core/ (a folder, or a .cpp file with its .hpp; core/ops.hpp belongs to ops/) must stand
on a floor of the table, and no file of core/ may include a file of a room on a higher floor. Prints
one line per include that runs back up, or per room the table does not place, and exits 1 then.
"""
import os
import re
import sys


def room_of(path):  # "core/ops/add.cpp" -> "ops/", "core/tensor.cpp" -> "tensor", "core/ops.hpp" -> "ops/"
    rel = path[len("core/"):]
    if "/" in rel:
        return rel.split("/")[0] + "/"
    stem = re.sub(r"\.(cpp|hpp|h|cu|cuh)$", "", rel)
    return "ops/" if stem == "ops" else stem


def floors(readme):
    table = {}
    for line in open(readme, encoding="utf-8"):
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(2)):
                table["ops/" if name == "ops.hpp" else name] = int(m.group(1))
    return table


def main(root):
    os.chdir(root)
    table = floors("core/README.md")
    if not table:
        print("core/README.md: no table of floors")
        return 1
    bad = 0
    unplaced = set()
    for folder, _, names in os.walk("core"):
        for name in sorted(names):
            if not re.search(r"\.(cpp|hpp|h|cu|cuh)$", name):
                continue
            path = os.path.join(folder, name)
            here = room_of(path)
            if here not in table:
                unplaced.add(here)
                continue
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = re.match(r'\s*#\s*include\s+"(core/[^"]+)"', line)
                if not m:
                    continue
                there = room_of(m.group(1))
                if there not in table:
                    unplaced.add(there)
                elif table[there] > table[here]:
                    print(f"{path}:{n}: includes {m.group(1)} (floor {table[there]}) from floor {table[here]}: "
                          "an include that runs back up")
                    bad += 1
    for r in sorted(unplaced):
        print(f"core/{r}: on no floor of core/README.md's table")
        bad += 1
    print(f"{len(table)} rooms on {len(set(table.values()))} floors, {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
