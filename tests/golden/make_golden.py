"""Regenerate tests/golden/<model>.json from transformers' own GGUF loader (needs torch).

Independent reference for tests/test_real_golden.py: transformers dequantizes the GGUF and
builds its tokenizer itself (no mlx_spec code involved), then we greedy-decode in float32.

    pip install torch==2.13.0 'transformers>=5.18'  # reference only; never a runtime dependency
    mlx-spec fetch qwen2.5-coder-1.5b  # assembles the recipe's .gguf in the cache
    python tests/golden/make_golden.py [--dir FOLDER] [model-stem ...]

Each .gguf is read from where its recipe assembles it (~/.cache/mlx-spec/sources/<recipe>/),
or from --dir when given.
"""

import argparse
import json
import sys
import time
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 32
# Older GGUF loaders cut user-defined tokens (<tool_call>, <|fim_prefix|>, ...) into pieces.
MIN_TRANSFORMERS = "5.18"

MODELS = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m": "chat",
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "chat",
    "gemma-3-270m-q4_k_m": "raw",  # base model; its GGUF carries no chat template
}
CHAT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences what a hash map is.",
]
RAW_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The capital of France is",
    "import numpy as np\n\n# Compute the mean of each row of a matrix\ndef row_means(m):\n",
]
TRICKY = [
    "Hello, world!",
    "def f(x):\n    return x ** 2\n\n\n",
    "    if x == 1:\n\t\tpass  # tabs and spaces",
    "a    b        c\u00a0d",
    "\n\n\n\n",
    "   leading and trailing   ",
    "don't you're I'll we've",
    "12345678901234 3.14159 1e-10",
    "caf\u00e9 na\u00efve \u00fcber r\u00e9sum\u00e9",
    "e\u0301 combining accent (not NFC)",
    "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
    "emoji \U0001f600\U0001f680 flags \U0001f1eb\U0001f1f7 zwj \U0001f468\u200d\U0001f4bb",
    "\u03a9\u2248\u00e7\u221a\u222b math \u2200x\u2208\u211d",
    "https://example.com/path?a=1&b=two#frag",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<eos>",
    '<tool_call>{"name": "f"}</tool_call>',
    "<unk> <pad> <mask> [multimodal]",
    "SELECT * FROM users WHERE id = 42;",
    "\u16d6\u16b1 runes and \u0928\u092e\u0938\u094d\u0924\u0947 devanagari",
    "",
    " ",
]


def greedy(model, ids, n):
    """Plain argmax loop with a KV cache; also records top-1 minus top-2 logit (the margin)."""
    import torch

    out, margins, past = [], [], None
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[0, -1].float()
            top = torch.topk(logits, 2)
            tok = int(top.indices[0])
            out.append(tok)
            margins.append(round(float(top.values[0] - top.values[1]), 5))
            x = torch.tensor([[tok]])
    return out, margins


def make(model_dir: Path, stem: str, kind: str) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    name = stem + ".gguf"
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=name, dtype=torch.float32)
    model.eval()
    load_s = time.time() - t0
    # Qwen2's real tokenizer normalizes text to NFC; transformers' GGUF tokenizer drops that
    # normalizer, so for qwen we feed it NFC text (what Qwen2Tokenizer itself would tokenize).
    nfc = "qwen" in stem
    norm = (lambda s: unicodedata.normalize("NFC", s)) if nfc else (lambda s: s)
    prompts = []
    if kind == "chat":
        for p in CHAT_PROMPTS:
            text = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            prompts.append(
                {"kind": "chat", "message": p, "text": text, "ids": tok.encode(text, add_special_tokens=False)}
            )
    for p in RAW_PROMPTS[: 3 - len(prompts)]:
        prompts.append({"kind": "raw", "text": p, "ids": tok.encode(p)})
    for p in prompts:
        t = time.time()
        p["golden_ids"], p["margins"] = greedy(model, p["ids"], NEW_TOKENS)
        p["golden_text"] = tok.decode(p["golden_ids"])
        print(f"{stem}: {time.time() - t:.1f}s {p['golden_text']!r}", flush=True)
    return {
        "note": (
            "Made by tests/golden/make_golden.py with transformers' GGUF loader "
            f"(transformers {transformers.__version__}, torch {torch.__version__}), float32, "
            f"plain greedy argmax with KV cache, {NEW_TOKENS} new tokens, no EOS stop. "
            "margins = top-1 minus top-2 logit at each step. Tokenizations use "
            "AutoTokenizer(gguf_file=...).encode(text) with special tokens"
            + (" on NFC-normalized text (Qwen2's own tokenizer normalizes to NFC)." if nfc else ".")
        ),
        "gguf_file": name,
        "gguf_size": (model_dir / name).stat().st_size,
        "load_seconds": round(load_s, 1),
        "prompts": prompts,
        "tokenizations": [{"text": s, "ids": tok.encode(norm(s))} for s in TRICKY],
    }


def recipe_folder(stem: str) -> Path | None:
    """The cache folder where the recipe assembling `stem`.gguf puts it."""
    from mlx_spec.make import recipes
    from mlx_spec.make.resolve import recipe_source_path

    hit = next((r for r in recipes.all_recipes() if r.pypi and r.pypi.file == f"{stem}.gguf"), None)
    return recipe_source_path(hit).parent if hit else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="folder holding the .gguf files (default: each recipe's cache folder)")
    ap.add_argument("models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        sys.exit(
            f"make_golden.py: transformers {transformers.__version__} < {MIN_TRANSFORMERS} "
            "tokenizes GGUF user-defined tokens wrongly"
        )
    for stem in args.models:
        folder = args.dir or recipe_folder(stem)
        if folder is None or not (folder / f"{stem}.gguf").is_file():
            print(f"skip {stem}: {stem}.gguf not in {folder or 'any recipe'}", file=sys.stderr)
            continue
        data = make(folder, stem, MODELS[stem])
        (HERE / f"{stem}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
