#!/usr/bin/env python3
"""The tree's layering, checked: every top-level folder includes only
folders below it, and the packages that must not link gRPC do not.

Layers, lowest first (a folder may include its own and lower layers):
  0 proto, math     the wire schema; header-only host/device math
  1 common          status, dtypes, chunking, thread pool, channels
  2 stats           the statistics record, histograms, the CPU path
  3 cuda, storage   the device path; the RocksDB store
  4 rules           rule types, the runner, rule configuration
  5 client          the hook, sender, spool, query client, CLI
  6 server          the collector
  7 examples        demos and example training code
  8 tests           end-to-end tests and their helpers
Test sources (*_test.cc, benchmarks, tests/testing helpers) may include
anything: they exercise the code from above.

The hook and the Python extension, which training processes load, link no
rule implementation (//rules:builtin_rules).

Prints one line per check and "check-layers: N passed, N failed, 0 skipped".
"""
import os
import re
import subprocess
import sys

LAYERS = {"proto": 0, "math": 0, "common": 1, "stats": 2, "cuda": 3, "storage": 3,
          "rules": 4, "client": 5, "server": 6, "examples": 7, "tests": 8}
NO_GRPC = ["//storage/...", "//rules/...", "//math/...", "//stats/..."]
# What the training process loads links no rule implementation: the rules
# run in the collector.
NO_RULES = ["//client:hook", "//client/python:sonde/_sonde.so"]


def is_test_source(path):
    name = os.path.basename(path)
    return (name.endswith(("_test.cc", "_bench.cc")) or "/testing/" in path
            or path.startswith("tests/") or "/bench/" in path or "/fuzz/" in path)


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = subprocess.check_output(["git", "ls-files"], text=True).split()
    sources = [f for f in files if re.search(r"\.(cc|h|cu|cuh)$", f)]
    upward = {}
    include = re.compile(r'^#include "([^"]+)"', re.M)
    for f in sources:
        top = f.split("/")[0]
        if top not in LAYERS or is_test_source(f):
            continue
        for target in include.findall(open(f, errors="replace").read()):
            to = target.split("/")[0]
            if to == top or to not in LAYERS:
                continue
            if LAYERS[to] >= LAYERS[top]:
                upward.setdefault(top, []).append(f"{f} includes {target}")
    passed = failed = 0
    for top in sorted(LAYERS):
        if upward.get(top):
            failed += 1
            print(f"check-layers: FAIL {top}/ includes a folder at or above its layer:")
            for line in upward[top][:10]:
                print(f"  {line}")
        else:
            passed += 1
            print(f"check-layers: ok   {top}/ includes only lower layers")
    checks = [(p, "//third_party:grpc", "links gRPC") for p in NO_GRPC]
    checks += [(t, "//rules:builtin_rules", "links the rule implementations") for t in NO_RULES]
    for source, target, what in checks:
        try:
            path = subprocess.run(["bazel", "query", f"somepath({source}, {target})"],
                                  capture_output=True, text=True, check=True).stdout.split()
        except (OSError, subprocess.CalledProcessError) as e:
            failed += 1
            print(f"check-layers: FAIL bazel query somepath({source}, {target}): {e}")
            continue
        if path:
            failed += 1
            print(f"check-layers: FAIL {source} {what}: {' -> '.join(path)}")
        else:
            passed += 1
            print(f"check-layers: ok   {source} does not depend on {target}")
    print(f"check-layers: {passed} passed, {failed} failed, 0 skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
