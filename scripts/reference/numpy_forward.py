#!/usr/bin/env python3
"""An independent float64 forward pass of a GGUF Llama model in numpy.

Weights are dequantized by the `gguf` package; everything else (RMSNorm,
interleaved RoPE, GQA causal attention, SwiGLU, tied output) is computed here
in float64 with no quantization of activations or of the KV cache. It is the
exact-arithmetic reference that Baton's logits are compared against, with a
tolerance derived from Baton's own rounding (8-bit activations, f16 KV).

    python scripts/reference/numpy_forward.py MODEL.gguf TOKEN_ID... > logits.f32

Writes float32 logits [n_tokens, vocab] to stdout.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    return reader.fields[key].contents()


def main():
    path = sys.argv[1]
    tokens = [int(t) for t in sys.argv[2:]]
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    n_layers = field(r, f"{arch}.block_count")
    n_heads = field(r, f"{arch}.attention.head_count")
    n_kv = field(r, f"{arch}.attention.head_count_kv")
    hidden = field(r, f"{arch}.embedding_length")
    eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon")
    theta = field(r, f"{arch}.rope.freq_base")
    hd = hidden // n_heads
    w = {}
    for t in r.tensors:
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            [int(d) for d in reversed(t.shape.tolist())])
    n = len(tokens)
    x = w["token_embd.weight"][tokens]
    pos = np.arange(n)[:, None]
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = pos * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    def rope(v):  # v [n, heads, hd], interleaved pairs
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a * cos[:, None, :] - b * sin[:, None, :]
        out[..., 1::2] = a * sin[:, None, :] + b * cos[:, None, :]
        return out

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(n_layers):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, n_heads, hd))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd))
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        group = n_heads // n_kv
        out = np.empty((n, n_heads, hd))
        for head in range(n_heads):
            g = head // group
            s = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        up = h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    out_w = w.get("output.weight", w["token_embd.weight"])
    logits = rms(x, w["output_norm.weight"]) @ out_w.T
    sys.stdout.buffer.write(logits.astype(np.float32).tobytes())


if __name__ == "__main__":
    main()
