#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl, the tokenizer test corpus.

Each line is a JSON object {"name": str, "b64": str, "utf8": bool}: the
string's exact bytes in base64 (so invalid UTF-8, NUL and control bytes
survive), and whether those bytes are valid UTF-8 (HF tokenizers can only
take those). This script is the readable source of the corpus; regenerate with

  .venv/bin/python scripts/reference/tokenizer_corpus.py

and then regenerate the golden files that depend on it
(tokenizer_llama_golden.py).
"""

import base64
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.jsonl")


def corpus():
    """Yields (name, bytes)."""
    t = []

    def add(name, s):
        t.append((name, s.encode("utf-8") if isinstance(s, str) else s))

    # --- Edge cases -------------------------------------------------------
    add("empty", "")
    add("one_space", " ")
    add("two_spaces", "  ")
    add("one_newline", "\n")
    add("one_tab", "\t")
    add("single_letter", "a")
    add("single_digit", "7")
    add("nul_byte", "a\x00b")
    add("control_chars", "\x01\x02\x1b[31mred\x1b[0m\x7f")
    # Bytes 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF have no
    # token in SmolLM2's vocabulary.
    add("control_without_tokens", "a\x04b\x1dc\x16d\x06e\x13\x14")
    add("plane_5_codepoint", "x\U00050000y\U000e0001z")

    # --- ASCII prose ------------------------------------------------------
    add("prose_hello", "Hello world")
    add("prose_hello_lead_space", " Hello world")
    add("prose_sentence", "The quick brown fox jumps over the lazy dog.")
    add("prose_paragraph",
        "It was the best of times, it was the worst of times, it was the age "
        "of wisdom, it was the age of foolishness...\nIt was the epoch of "
        "belief; it was the epoch of incredulity!")
    add("prose_quotes", "She said, \"Don't go!\" -- and he didn't.")
    add("prose_punct_runs", "Wait... what?!?! (really) [yes] {no} <maybe>")
    add("prose_urls", "See https://huggingface.co/HuggingFaceTB/SmolLM2-135M?x=1&y=2#top")
    add("prose_email", "mail me: first.last+tag@example.org")
    add("prose_markdown", "# Title\n\n* item one\n* item two\n\n**bold** _it_ `code`")
    add("prose_caps", "HELLO WORLD, THIS IS LOUD. CamelCase snake_case kebab-case")
    add("prose_hyphen_dash", "state-of-the-art — em dash – en dash")
    add("prose_ellipsis_unicode", "Well… “curly quotes” and ‘single’")
    add("prose_long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis")
    add("prose_repeated", "na " * 40 + "Batman!")
    add("prose_at_hash", "@user #hashtag $100 %50 ^caret &amp *star")

    # --- Contractions -----------------------------------------------------
    for c in ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]:
        add("contraction_lower" + c[1:], "it" + c + " fine")
    for c in ["'S", "'T", "'RE", "'VE", "'M", "'LL", "'D"]:
        add("contraction_upper" + c[1:].lower(), "IT" + c + " FINE")
    add("contraction_mixed", "I'm sure you're right, they've said we'll see; he'd know. It'S Re'Ve")
    add("contraction_standalone", "'s 't 're 've 'm 'll 'd ' '' '''")
    add("contraction_curly", "it’s can’t")
    add("contraction_digit", "'90s rock'n'roll")

    # --- Digits -----------------------------------------------------------
    for d in ["1", "12", "123", "1234", "12345", "1234567890"]:
        add("digits_" + d, d)
    add("digits_spaced", "1 12 123 1234 12345 123456 1234567")
    add("digits_in_words", "abc123def 4ever h2o")
    add("digits_decimal", "3.14159 -2.5e10 0x1F 1,000,000")
    add("digits_date", "2024-06-01T12:34:56Z")
    add("digits_phone", "+1 (555) 123-4567")
    add("digits_unicode", "½ ² ³ ١٢٣ ४५६ Ⅻ ①")
    add("digits_long", "9" * 50)

    # --- Whitespace -------------------------------------------------------
    add("ws_spaces_4", "    ")
    add("ws_spaces_before_word", "   word")
    add("ws_spaces_after_word", "word   ")
    add("ws_spaces_between", "a    b")
    add("ws_tabs", "\t\tindented\twith\ttabs\t")
    add("ws_newlines", "line1\n\nline2\n\n\nline3\n")
    add("ws_crlf", "windows\r\nline\r\nendings\r\n")
    add("ws_mixed_before_word", " \t \n  x")
    add("ws_mixed_runs", "a \n\t b\n \n c\t\t\n\nd")
    add("ws_long_spaces", " " * 100)
    add("ws_long_newlines", "\n" * 40)
    add("ws_long_tabs", "\t" * 33)
    add("ws_trailing_newline_word", "end\n")
    add("ws_space_newline_space", " \n ")
    add("ws_unicode_spaces", "a\u00a0b\u2003c\u3000d\u2009e\u202ff")
    add("ws_nel_and_mongolian", "x\u0085y\u180ez\u200bw\ufeffv")
    add("ws_line_sep", "p\u2028q\u2029r")
    add("ws_vertical_tab_ff", "a\x0bb\x0cc")
    add("ws_space_before_punct", "hello , world ! ?")
    add("ws_space_before_digits", "x 42 and  42")
    add("ws_space_before_cjk", "x 你好")

    # --- Source code ------------------------------------------------------
    add("code_python", 'def fib(n: int) -> int:\n    """Fibonacci."""\n'
        '    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n')
    add("code_python_class", "class Foo(Bar):\n    def __init__(self, x=None, **kw):\n"
        "        super().__init__(**kw)\n        self._x = x or {}\n")
    add("code_cpp", "#include <vector>\n\nint main(int argc, char** argv) {\n"
        "  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n"
        "  return v.size() > 2 ? 0 : -1;\n}\n")
    add("code_cpp_template", "template <typename T>\nconstexpr T Max(T a, T b) noexcept "
        "{ return a < b ? b : a; }  // NOLINT")
    add("code_json", '{"name": "baton", "version": [1, 2, 3], "nested": {"ok": true, '
        '"pi": 3.14, "none": null}, "escaped": "line\\nbreak \\u00e9"}')
    add("code_json_pretty", '{\n  "a": 1,\n  "b": [\n    "x",\n    "y"\n  ]\n}')
    add("code_shell", "for f in *.txt; do echo \"$f\" | wc -l >> out.log 2>&1; done")
    add("code_sql", "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;")
    add("code_html", '<div class="x"><a href="/p?q=1">link</a></div>')
    add("code_rust", "fn main() { let v: Vec<u8> = vec![0; 16]; println!(\"{:?}\", &v[..4]); }")
    add("code_regex", r"^\s+(?!\S)[\p{L}\p{N}]*$|\d{3}-\d{4}")
    add("code_operators", "a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2; m&&n||!o; p->q; r::s")
    add("code_indent_4", "        return x\n    else:\n        pass")

    # --- CJK and other scripts --------------------------------------------
    add("cjk_chinese", "你好，世界！今天天气很好。")
    add("cjk_japanese", "こんにちは、世界。カタカナとひらがな、漢字。")
    add("cjk_korean", "안녕하세요 세계")
    add("cjk_mixed_ascii", "Python是一种编程语言, version 3.12 发布了")
    add("cjk_fullwidth", "ＡＢＣ１２３！？")
    add("cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок.")
    add("greek", "Καλημέρα κόσμε, ΑΒΓΔ αβγδ")
    add("thai", "สวัสดีชาวโลก")
    add("devanagari", "नमस्ते दुनिया")
    add("arabic_rtl", "مرحبا بالعالم")
    add("hebrew_rtl", "שלום עולם")
    add("rtl_mixed_ltr", "The word שלום means peace; مرحبا means hello.")
    add("rtl_marks", "a\u200fb\u200ec\u202bd\u202ce")
    add("german_umlauts", "Größenwahn Straße Übermut")
    add("french_accents", "Ça, c'est déjà l'été à Noël")
    add("vietnamese", "Tiếng Việt có dấu")
    add("turkish_dotless", "İstanbul ılık ışık")
    add("math_symbols", "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x| ∑∫∂")
    add("currency", "€100 £50 ¥1000 ₹20 ₿0.1")
    add("box_drawing", "┌──┐\n│ok│\n└──┘")

    # --- Combining marks --------------------------------------------------
    add("combining_acute", "e\u0301 cafe\u0301")
    add("combining_stack", "a\u0300\u0301\u0302\u0303\u0304")
    add("combining_zalgo", "Z\u0351\u036b\u0343a\u0367l\u0368g\u0303o\u0310")
    add("combining_standalone", "\u0301\u0302 x")
    add("combining_hangul_jamo", "\u1100\u1161\u11a8")

    # --- Emoji ------------------------------------------------------------
    add("emoji_simple", "I love 🍕 and 🎉!")
    add("emoji_only", "😀😃😄😁")
    add("emoji_zwj_family", "👨\u200d👩\u200d👧\u200d👦")
    add("emoji_zwj_professions", "👩\u200d💻 👨\u200d🚀 🏳\ufe0f\u200d🌈")
    add("emoji_skin_tones", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿")
    add("emoji_flags", "🇺🇸 🇯🇵 🇩🇪")
    add("emoji_keycap", "1\ufe0f\u20e3 #\ufe0f\u20e3")
    add("emoji_variation", "☺\ufe0f ☺\ufe0e ❤️")
    add("emoji_in_code", "print('🐍')  # snake")

    # --- Special tokens in text -------------------------------------------
    add("special_im_start", "<|im_start|>")
    add("special_im_end", "<|im_end|>")
    add("special_chat", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    add("special_adjacent", "<|im_start|><|im_end|><|endoftext|>")
    add("special_in_word", "abc<|im_end|>def")
    add("special_with_spaces", " <|im_start|> system <|im_end|> ")
    add("special_partial", "<|im_start| <|im_end <im_start|> |im_end|>")
    add("special_other", "<repo_name>baton<file_sep>main.cc<filename>x<gh_stars>10")
    add("special_jupyter", "<jupyter_start><jupyter_code>print(1)<jupyter_output>1")
    add("special_endoftext_mid", "first doc<|endoftext|>second doc")
    add("special_lookalike_llama3", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    add("special_nested", "<<|im_start|>|im_end|>>")

    # --- Invalid UTF-8 ----------------------------------------------------
    add("invalid_lone_continuation", b"a\x80b")
    add("invalid_many_continuations", b"\x80\x81\xbf\xbf")
    add("invalid_truncated_2", b"x\xc3")
    add("invalid_truncated_2_mid", b"x\xc3y")
    add("invalid_truncated_3", b"\xe2\x82 euro")
    add("invalid_truncated_4", b"\xf0\x9f\x98 smile")
    add("invalid_ff", b"\xff")
    add("invalid_fe_ff", b"ab\xfe\xffcd")
    add("invalid_f8", b"\xf8\x88\x80\x80\x80")
    add("invalid_overlong_slash", b"\xc0\xaf")
    add("invalid_overlong_nul", b"a\xc0\x80b")
    add("invalid_overlong_3", b"\xe0\x80\xaf")
    add("invalid_surrogate", b"\xed\xa0\x80 x")
    add("invalid_surrogate_pair", b"\xed\xa0\xbd\xed\xb8\x80")
    add("invalid_mixed_valid", b"caf\xc3\xa9 \xe9t\xe9 \xff ok")
    add("invalid_latin1", "naïve café".encode("latin-1"))
    add("invalid_bad_second_byte", b"\xe2\x28\xa1")
    add("invalid_space_runs", b"  \x80  \xff\n\n")
    add("invalid_before_special", b"\xff<|im_end|>\x80")
    add("invalid_digits", b"1\x802\xff3")

    # --- Seeded random mixtures (valid UTF-8) -----------------------------
    rng = random.Random(20240601)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éüñçßøåæœ",
        "你好世界日本語한국어",
        "😀👍🏽🍕🇺🇸\u200d",
        "\u0301\u0308\u00a0\u3000",
        "'s're've",
    ]
    for i in range(40):
        n = rng.randint(1, 60)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(n))
        add("random_%02d" % i, s)
    for i in range(10):
        n = rng.randint(1, 40)
        add("random_bytes_%02d" % i, bytes(rng.randrange(256) for _ in range(n)))
    return t


def main():
    entries = corpus()
    names = [n for n, _ in entries]
    assert len(names) == len(set(names)), "duplicate names"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="ascii") as f:
        for name, b in entries:
            try:
                b.decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            f.write(json.dumps({"name": name, "b64": base64.b64encode(b).decode("ascii"),
                                "utf8": valid}) + "\n")
    print("wrote %d strings to %s" % (len(entries), OUT))


if __name__ == "__main__":
    main()
