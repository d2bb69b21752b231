#!/usr/bin/env python3
"""Writes a GGUF Llama model as a Hugging Face checkpoint folder.

    python scripts/reference/gguf_to_hf.py MODEL.gguf OUT_DIR

OUT_DIR gets config.json and model.safetensors (float32, written by the
`safetensors` package) with HF tensor names. Weights are the `gguf` package's
dequantization, and Q/K rows are put back into HF's rotate-half order (GGUF
converters permute them for interleaved RoPE). The same model in both formats
lets tests check Baton's HF loading, names and RoPE convention end to end.
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file


def unpermute(w, n_head):
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main():
    path, out = sys.argv[1], sys.argv[2]
    r = GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = f["general.architecture"]
    n_head = f[f"{arch}.attention.head_count"]
    n_kv = f[f"{arch}.attention.head_count_kv"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": f[f"{arch}.embedding_length"],
        "intermediate_size": f[f"{arch}.feed_forward_length"],
        "num_hidden_layers": f[f"{arch}.block_count"],
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "vocab_size": len(r.fields["tokenizer.ggml.tokens"].data),
        "max_position_embeddings": f[f"{arch}.context_length"],
        "rms_norm_eps": f[f"{arch}.attention.layer_norm_rms_epsilon"],
        "rope_theta": f.get(f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": all(t.name != "output.weight" for t in r.tensors),
        "torch_dtype": "float32",
    }
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
            [int(d) for d in reversed(t.shape.tolist())])
        if t.name.startswith("blk."):
            _, layer, role, kind = t.name.split(".")
            if role == "attn_q":
                w = unpermute(w, n_head)
            elif role == "attn_k":
                w = unpermute(w, n_kv)
            name = f"model.layers.{layer}.{per_layer[role]}.{kind}"
        else:
            name = names[t.name]
        tensors[name] = np.ascontiguousarray(w)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as fp:
        json.dump(config, fp, indent=1)
    save_file(tensors, os.path.join(out, "model.safetensors"))


if __name__ == "__main__":
    main()
