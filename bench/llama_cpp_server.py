#!/usr/bin/env python3
"""llama-cpp-python's OpenAI server (`python -m llama_cpp.server ARGS`),
with one option of its own, before the server's:

  --extra_bufts=auto|on|off   llama.cpp's extra CPU buffer types (its AMX
                              kernels and weight repacking); auto: off on
                              an AMX host, where they crash
                              (bench/llama_cpp_host.py)

    python bench/llama_cpp_server.py --extra_bufts=auto --model M.gguf ...
"""
import runpy
import sys

import llama_cpp_host

mode = "auto"
for arg in list(sys.argv[1:]):
    if arg.startswith("--extra_bufts="):
        mode = arg.split("=", 1)[1]
        sys.argv.remove(arg)
on = llama_cpp_host.configure(mode)
print(f"llama_cpp_server: extra CPU buffer types {'on' if on else 'off'}",
      file=sys.stderr, flush=True)
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
