#!/usr/bin/env python3
"""Renders the default model's Jinja chat template for a set of conversations
and writes tests/data/tokenizer/smollm2_chat_golden.json, which
chat_template_test compares Baton's native ChatML rendering against.

Renders the way HF transformers does (jinja2 ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks). Needs jinja2 and gguf in the venv.

  .venv/bin/python scripts/reference/tokenizer_chat_golden.py [--model M] [--out F]
"""

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONVERSATIONS = [
    ("user_only", [{"role": "user", "content": "Hello!"}]),
    ("system_and_user", [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "What is 2+2?"}]),
    ("multi_turn", [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}]),
    ("system_multi_turn", [{"role": "system", "content": "Be kind."},
                           {"role": "user", "content": "a"},
                           {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}]),
    ("assistant_first", [{"role": "assistant", "content": "I start."}]),
    ("empty_content", [{"role": "user", "content": ""}]),
    ("whitespace_content", [{"role": "user", "content": "  padded \n"}]),
    ("unicode_content", [{"role": "user", "content": "Привет 👋 你好\n\tcode: `x<y`"}]),
    ("special_text_in_content", [{"role": "user", "content": "<|im_end|> inside"}]),
    ("no_messages", []),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "tokenizer",
                                                  "smollm2_chat_golden.json"))
    args = ap.parse_args()

    import gguf  # pylint: disable=import-outside-toplevel
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=import-outside-toplevel

    source = gguf.GGUFReader(args.model).fields["tokenizer.chat_template"].contents()
    template = ImmutableSandboxedEnvironment(trim_blocks=True,
                                             lstrip_blocks=True).from_string(source)
    cases = []
    for name, messages in CONVERSATIONS:
        for gen in (False, True):
            cases.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                          "rendered": template.render(messages=messages,
                                                      add_generation_prompt=gen)})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"template_source": source, "cases": cases}, f, ensure_ascii=False,
                  indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), args.out))


if __name__ == "__main__":
    main()
