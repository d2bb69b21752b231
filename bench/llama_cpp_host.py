"""llama.cpp (llama-cpp-python 0.3.36) set up for this host.

On a CPU with AMX (Sapphire Rapids and later Xeons), llama.cpp's AMX
matrix kernels, one of its "extra" CPU buffer types, crash on the default
model: SIGSEGV in ggml_backend_amx_mul_mat at the first evaluation. Without
the extra buffer types llama.cpp runs its AVX-512 / AVX2 dot products, the
instructions Baton's kernels use; they also turn off its weight repacking,
so they stay on where the host has no AMX.

    import llama_cpp_host
    extra_bufts = llama_cpp_host.configure("auto")  # before loading a model
"""
import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_c


def has_amx():
    """Whether /proc/cpuinfo lists AMX tiles for int8 (amx_int8)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False


def configure(extra_bufts="auto"):
    """Loads models with (on) or without (off) llama.cpp's extra CPU buffer
    types; auto: without them on an AMX host. Returns whether they are on."""
    if extra_bufts not in ("auto", "on", "off"):
        raise ValueError(f"extra_bufts: auto, on or off, got {extra_bufts!r}")
    on = extra_bufts == "on" or (extra_bufts == "auto" and not has_amx())
    if not on:
        defaults = llama_cpp_c.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        # The Llama class looks it up in llama_cpp.llama_cpp, the low-level
        # API's callers in the package.
        llama_cpp_c.llama_model_default_params = without_extra_bufts
        llama_cpp.llama_model_default_params = without_extra_bufts
    return on
