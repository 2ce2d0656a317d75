#!/usr/bin/python3
"""Reference encodings for Lattice's BPE tokenizer, made by tiktoken from the local GPT-2 files.

Builds tiktoken's GPT-2 encoding from tests/testdata/gpt2/encoder.json + vocab.bpe (no download:
tiktoken.load.data_gym_to_mergeable_bpe_ranks reads local paths), encodes a fixed set of varied texts
(unicode, numbers, whitespace runs, contractions, emoji, special tokens) and writes
tests/reference/data/tokenizer_gpt2_reference.json: {"texts": [...], "allow_special": [...],
"ids": [[...], ...]}. tests/data/test_tokenizer_gpt2.cpp compares Lattice's encodings against it.

Usage: /usr/bin/python3 tests/reference/make_tokenizer_reference.py [--gpt2-dir DIR] [--out FILE]
"""
import argparse
import json
import os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

TEXTS = [
    "hello world",
    "Hello, World! It's a test: we'll see, they're done, I've been, I'm here, she'd go.",
    "Numbers: 0 00 000 0000 000000000 3.14159 1,234,567 -42 +7e10 2026-11-29 12:00:00",
    "Whitespace:  two spaces,   three,\ttab,\t\ttwo tabs,\nnewline,\n\nblank line,    \n  trailing   ",
    "   leading spaces and a final run of spaces         ",
    "Unicode: café naïve résumé Ångström Straße İstanbul ñandú ǅ ﬁ",
    "Greek Ελληνικά, Cyrillic Привет мир, Hebrew שלום, Arabic مرحبا, Hindi नमस्ते",
    "CJK: 日本語のテキスト、中文文本，한국어 텍스트。全角スペース\u3000あり",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ 🤖🦀🐍 and text after",
    "Code: def f(x): return x**2 + 1  # comment\n    if (a && b) { c->d(); } // C++\n",
    "URL https://example.com/path?q=1&r=two#frag and email someone@example.org",
    "Mixed CASE and ALLCAPS, camelCase, snake_case, kebab-case, SCREAMING_SNAKE",
    "Apostrophes: 'quoted' don't DON'T it’s (curly) rock'n'roll o'clock '' '''",
    "Punctuation runs: !!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "Special <|endoftext|> inside, allowed",
    "Special <|endoftext|> inside, not allowed",
    "<|endoftext|>",
    "Control chars: \x00\x01\x07\x1b[0m\x7f and NBSP:\u00a0:end, narrow nbsp\u202f, ideographic\u3000",
    "Long word: pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "Repeats: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Digits run: 12345678901234567890123456789012345678901234567890",
    "Math: ∀x∈ℝ, ∃y: x² + y² ≤ 1; ∫₀¹ f(t) dt ≈ π/4 → ∞",
    "Newlines\r\nwindows\r\n\r\nand old mac\rstyle",
    "",
]
ALLOW_SPECIAL = [t == "Special <|endoftext|> inside, allowed" or t == "<|endoftext|>" for t in TEXTS]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2-dir", default=os.path.join(HERE, "..", "testdata", "gpt2"))
    parser.add_argument("--out", default=os.path.join(HERE, "data", "tokenizer_gpt2_reference.json"))
    args = parser.parse_args()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(args.gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(args.gpt2_dir, "encoder.json"))
    enc = tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    ids = []
    for text, allow in zip(TEXTS, ALLOW_SPECIAL):
        if allow:
            ids.append(enc.encode(text, allowed_special="all"))
        else:
            ids.append(enc.encode(text, disallowed_special=()))
        assert enc.decode(ids[-1]) == text
    with open(args.out, "w", encoding="utf-8") as f:
        # One text / one id list per line, so that a diff shows which encoding changed.
        def lines(values):
            return ",\n".join(json.dumps(v, ensure_ascii=False) for v in values)
        f.write('{"generator": "tests/reference/make_tokenizer_reference.py",\n')
        f.write(f'"tiktoken": "{tiktoken.__version__}",\n')
        f.write(f'"allow_special": {json.dumps(ALLOW_SPECIAL)},\n')
        f.write(f'"texts": [\n{lines(TEXTS)}],\n')
        f.write(f'"ids": [\n{lines(ids)}]}}\n')
    print(f"wrote {len(TEXTS)} encodings ({sum(map(len, ids))} ids) to {args.out}")


if __name__ == "__main__":
    main()
