#!/usr/bin/env python3
"""Fails on an #include that crosses the allowed folder graph.

Each source file belongs to a unit: its folder under the repository root,
two levels deep for common/, coordinator/, model/, kernels/, worker/, bench/
and tests/ (e.g. worker/engine), one level otherwise (cli, proto). A
program's file may include its own unit and the units ALLOWED lists for it;
test code (tests/, bench/, common/testing/, and *_test*, *test_util*,
*_test_base* files anywhere) may include any unit. Generated protobuf headers
(baton/v1/...) count as unit `proto`.

  scripts/check_includes.py [ROOT]     check the tree (default: this repo)
  scripts/check_includes.py --self-test
                                       prove the check fails on a bad tree

Exit status 1 names every crossing include; ctest runs both forms
(include_graph_test, include_graph_self_test).
"""

import os
import re
import subprocess
import sys
import tempfile

TWO_LEVEL = {"common", "coordinator", "model", "kernels", "worker", "bench", "tests"}

_COMMON = {"common", "common/async", "common/fault", "common/tsan",
           "common/metrics"}
_MODEL = {"model", "model/gguf", "model/config", "model/safetensors",
          "model/tokenizer"}

# unit -> units its program code may include (besides itself). The layers,
# bottom up: common; model and kernels; the worker's parts; the services; the
# programs (cli). The coordinator's units reach the worker only for its
# shared vocabulary (worker/sampler, worker/kv_cache's layout), never its
# engine, transports, service or the kernels.
ALLOWED = {
    "common": {"common/tsan"},
    "common/async": {"common", "common/tsan"},
    "common/fault": {"common"},
    "common/tsan": set(),
    "common/metrics": {"common"},
    "common/grpc": {"common", "common/async", "common/tsan", "proto"},
    "common/auth": {"common", "common/grpc"},
    "proto": {"common", "model", "worker/sampler", "worker/kv_cache"},
    "model": {"common"},
    "model/gguf": {"common", "model"},
    "model/config": {"common", "model", "model/gguf"},
    "model/safetensors": {"common", "model"},
    "model/tokenizer": {"common", "model", "model/gguf"},
    "model/synth": _COMMON | _MODEL | {"kernels/cpu"},
    "kernels/cpu": {"common", "model"},
    "kernels/cuda": {"common", "model", "kernels/cpu"},
    "worker/sampler": {"common"},
    "worker/kv_cache": {"common", "model", "kernels/cpu"},
    "worker/transport": _COMMON | {"common/grpc", "proto", "model",
                                   "worker/kv_cache", "kernels/cuda"},
    "worker/engine": _COMMON | _MODEL | {"kernels/cpu", "worker/kv_cache",
                                         "worker/sampler", "worker/transport"},
    "worker/cuda": _COMMON | _MODEL | {"model/synth", "kernels/cpu",
                                       "kernels/cuda", "worker/kv_cache",
                                       "worker/sampler", "worker/transport",
                                       "worker/engine"},
    "worker/service": _COMMON | _MODEL | {"common/grpc", "common/auth", "proto",
                                          "kernels/cpu", "worker/kv_cache",
                                          "worker/sampler", "worker/transport",
                                          "worker/engine", "worker/cuda"},
    "coordinator": {"common", "common/tsan", "model", "worker/kv_cache"},
    "coordinator/http": _COMMON | {"common/grpc", "common/auth", "proto",
                                   "worker/sampler"},
    "coordinator/service": _COMMON | {"common/grpc", "common/auth", "proto",
                                      "model", "model/config", "model/gguf",
                                      "model/tokenizer", "worker/sampler",
                                      "worker/kv_cache", "coordinator",
                                      "coordinator/http"},
    "cli": _COMMON | _MODEL | {"common/grpc", "common/auth", "proto",
                               "model/synth", "kernels/cpu", "worker/kv_cache",
                               "worker/sampler", "worker/engine"},
}

SOURCE = re.compile(r"\.(h|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TEST_FILE = re.compile(r"(_test[^/]*|test_util[^/]*|_test_base[^/]*)\.(h|cc|cu)$")


def unit_of(path):
    parts = path.split("/")
    if parts[0] in TWO_LEVEL and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def is_test_code(path):
    return (path.startswith(("tests/", "bench/", "common/testing/"))
            or TEST_FILE.search(path) is not None)


def source_files(root):
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others",
                              "--exclude-standard"], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        files = out.split()
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = [d for d in dirnames
                           if not d.startswith((".", "build"))]
            for n in names:
                files.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(f for f in files
                  if SOURCE.search(f) and os.path.isfile(os.path.join(root, f)))


def check(root):
    files = source_files(root)
    units = {unit_of(f) for f in files} | {"proto"}
    errors = []
    for path in files:
        if is_test_code(path):
            continue
        unit = unit_of(path)
        if unit not in ALLOWED:
            errors.append(f"{path}: unit {unit} has no entry in "
                          f"scripts/check_includes.py ALLOWED")
            continue
        with open(os.path.join(root, path), encoding="utf-8",
                  errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if target.startswith("baton/"):
                    target_unit = "proto"
                elif "/" in target and unit_of(target) in units:
                    target_unit = unit_of(target)
                else:
                    continue  # same folder, or not the project's
                if target_unit == unit or target_unit in ALLOWED[unit]:
                    continue
                errors.append(f"{path}:{number}: {unit} may not include "
                              f"{target} ({target_unit}); allowed: "
                              f"{', '.join(sorted(ALLOWED[unit])) or 'none'}")
    return files, errors


def self_test():
    """The check must fail on a tree with a crossing include and pass on one
    without it."""
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        write("worker/engine/engine.h", "#pragma once\n")
        write("worker/sampler/sampler.h", "#pragma once\n")
        write("coordinator/service/cluster.cc",
              '#include "worker/sampler/sampler.h"\n')
        write("coordinator/service/cluster_test.cc",
              '#include "worker/engine/engine.h"\n')
        _, errors = check(root)
        if errors:
            print("self-test: a clean tree failed:", *errors, sep="\n  ")
            return 1
        write("coordinator/service/generate_call.cc",
              '#include <vector>\n#include "worker/engine/engine.h"\n')
        _, errors = check(root)
        expected = ("coordinator/service/generate_call.cc:2: "
                    "coordinator/service may not include worker/engine/engine.h")
        if len(errors) != 1 or not errors[0].startswith(expected):
            print("self-test: expected one error starting with:", expected,
                  "got:", *errors, sep="\n  ")
            return 1
    print("self-test: the check passes a clean tree and names the crossing "
          "include of a bad one")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    files, errors = check(os.path.abspath(root))
    for e in errors:
        print(e)
    if errors:
        print(f"check_includes: {len(errors)} include(s) cross the folder "
              f"graph in {len(files)} files")
        return 1
    print(f"check_includes: {len(files)} files, no include crosses the "
          f"folder graph")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
