#!/usr/bin/env python3
"""Prints the ninja targets the tests of a meson test selection need (their executables and every
target they depend on), so a sanitizer build compiles only those.
Usage: targets.py BUILD_DIR [--suite S]... [--no-suite S]..."""
import json
import os
import subprocess
import sys

build, args = sys.argv[1], sys.argv[2:]
include = [args[i + 1] for i, a in enumerate(args) if a == "--suite"]
exclude = [args[i + 1] for i, a in enumerate(args) if a == "--no-suite"]


def introspect(what):
    out = subprocess.run(["meson", "introspect", "--" + what, build], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def suites(test):  # "project:unit" -> "unit"
    return {s.split(":", 1)[-1] for s in test["suite"]}


files_of = {t["id"]: t["filename"] for t in introspect("targets")}
targets = set()
for test in introspect("tests"):
    s = suites(test)
    if (include and not s & set(include)) or s & set(exclude):
        continue
    for dep in test["depends"]:
        for f in files_of.get(dep, []):
            targets.add(os.path.relpath(f, os.path.abspath(build)))
print("\n".join(sorted(targets)))
