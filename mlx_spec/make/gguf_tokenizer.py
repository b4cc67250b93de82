"""Rebuild a Hugging Face fast tokenizer (tokenizer.json + configs) from a GGUF file's vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SourceError, UnsupportedError
from .gguf_reader import GGUFFile

# llama.cpp token types
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer split regexes by `tokenizer.ggml.pre` (the ones transformers/llama.cpp use).
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# pre name -> (regex, NFC-normalize, ignore_merges); Qwen2's own tokenizer normalizes to NFC
# and Llama 3's looks whole words up before merging, as llama.cpp does too.
_PRE = {
    "qwen2": (_QWEN2, True, False),
    "deepseek-r1-qwen": (_QWEN2, True, False),
    "llama-bpe": (_LLAMA3, False, True),
    "llama3": (_LLAMA3, False, True),
    "llama-v3": (_LLAMA3, False, True),
    "smaug-bpe": (_LLAMA3, False, False),
    "gpt2": (_GPT2, False, False),
    "gpt-2": (_GPT2, False, False),
    "default": (_GPT2, False, False),
}

# Tokens llama.cpp also treats as end-of-generation when they are in the vocabulary.
_EOG_NAMES = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<|end_of_text|>",
)

# Used only when the GGUF has no tokenizer.chat_template (e.g. base Gemma 3 files).
_GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}"
    "{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
_CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte, as used by byte-level BPE vocabularies."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate spelling keeps its first id
    return vocab


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary (same order as transformers' generate_merges):
    every split of a piece into two known pieces, best-scoring merged piece first."""
    merges = []
    for piece, score in scores.items():
        local = [
            (piece[:i], piece[i:], score) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab
        ]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _byte_level(info: GGUFFile, tokens: list[str]):
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    pre = info.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise UnsupportedError(
            f"{info.path}: byte-level pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE))})"
        )
    regex, nfc, ignore_merges = _PRE[pre]
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens are stored already byte-spelled; respell any that are not (llama.cpp mislabels).
    spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    merges = info.get("tokenizer.ggml.merges")
    if merges is None:
        raise SourceError(f"{info.path}: byte-level BPE vocabulary without tokenizer.ggml.merges")
    tok = Tokenizer(
        models.BPE(
            vocab=_vocab(spelled),
            merges=[tuple(m.split(" ", 1)) for m in merges],
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=ignore_merges,
        )
    )
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok, spelled, alphabet


def _sentencepiece(info: GGUFFile, tokens: list[str], unk: str | None):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    gemma = info.architecture.startswith("gemma")
    if gemma:
        # Gemma files store whitespace-run tokens as real spaces; its BPE sees them as "▁▁".
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = _vocab(tokens)
    scores_arr = info.get("tokenizer.ggml.scores")
    if gemma or scores_arr is None:
        # Gemma's scores do not follow its merge order; the file order does.
        scores = {t: -float(i) for i, t in enumerate(tokens)}
    else:
        scores = {t: float(s) for t, s in zip(tokens, scores_arr)}
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges_from_scores(vocab, scores),
            dropout=None,
            fuse_unk=True,
            byte_fallback=True,
            unk_token=unk,
        )
    )
    strip = []
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        # As llama.cpp and Llama 2's own tokenizer.json do: a space goes before every text
        # segment (even one already starting with a space), so decoding is lossless.
        prefix = bool(info.get("tokenizer.ggml.add_space_prefix", True))
        replace = normalizers.Replace(" ", "\u2581")
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if prefix else replace
        strip = [decoders.Strip(content=" ", left=1)] if prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tok, tokens


def _chat_template(info: GGUFFile, vocab: set[str]) -> str | None:
    tpl = info.get("tokenizer.chat_template")
    if tpl:
        return tpl
    if "<start_of_turn>" in vocab and info.architecture.startswith("gemma"):
        return _GEMMA_TEMPLATE
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return _CHATML_TEMPLATE
    return None


def write_tokenizer(info: GGUFFile, out_dir: Path, cfg: dict) -> dict:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json for `info` into
    out_dir. Returns {"eos_token_ids": [...], "chat_template": str | None,
    "transformers_version": str}, the last for config.json (see the comment at the end)."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tokens = info.get("tokenizer.ggml.tokens")
    if not tokens:
        raise SourceError(f"{info.path}: no tokenizer.ggml.tokens vocabulary")
    tokens = list(tokens)
    types = [int(x) for x in info.get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens))]
    special_id = {k: info.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown", "padding")}
    name = {k: (tokens[int(v)] if v is not None and int(v) < len(tokens) else None) for k, v in special_id.items()}
    model = info.get("tokenizer.ggml.model")
    hf_json = info.get("tokenizer.huggingface.json")
    alphabet = None
    if hf_json:
        tok = Tokenizer.from_str(hf_json)
    elif model == "gpt2":
        tok, spelled, alphabet = _byte_level(info, tokens)
    elif model == "llama":
        tok, spelled = _sentencepiece(info, tokens, name["unknown"])
    else:
        raise UnsupportedError(f"{info.path}: tokenizer model {model!r} is not supported (supported: gpt2, llama)")
    if not hf_json:
        vocab = tok.get_vocab()
        # Control tokens must stay whole; in a byte-level vocabulary one spelled outside the
        # byte alphabet is a llama.cpp mislabel, so it is not added.
        tok.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty in (_CONTROL, _UNKNOWN) and (alphabet is None or set(t) <= alphabet)
            ]
        )
        tok.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _USER_DEFINED and t in vocab
            ]
        )
    add_bos = bool(info.get("tokenizer.ggml.add_bos_token", model == "llama"))
    add_eos = bool(info.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = name["bos"], name["eos"]
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    if (add_bos or add_eos) and not hf_json:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        pair = single + " " + " ".join([f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
        specials = {
            (bos, int(special_id["bos"])) if add_bos else None,
            (eos, int(special_id["eos"])) if add_eos else None,
        } - {None}
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=sorted(specials))
    elif alphabet is not None:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    specials_map = {
        k: v
        for k, v in (
            ("bos_token", bos),
            ("eos_token", eos),
            ("unk_token", name["unknown"]),
            ("pad_token", name["padding"]),
        )
        if v is not None
    }
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **specials_map)
    fast.save_pretrained(str(out_dir))
    template = _chat_template(info, set(tokens))
    vocab_set = set(tok.get_vocab())
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials_map,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(cfg.get("max_position_embeddings", 4096)),
    }
    if template:
        tcfg["chat_template"] = template
        (out_dir / "chat_template.jinja").unlink(missing_ok=True)  # one source of truth
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials_map, indent=2, ensure_ascii=False))

    eos_ids = [int(special_id["eos"])] if special_id["eos"] is not None else []
    for key in ("eot", "eom"):
        if (v := info.get(f"tokenizer.ggml.{key}_token_id")) is not None and int(v) not in eos_ids:
            eos_ids.append(int(v))
    ids = {t: i for i, t in enumerate(tokens)}
    for t in _EOG_NAMES:
        i = ids.get(t)
        if i is not None and types[i] == _CONTROL and t in vocab_set and i not in eos_ids:
            eos_ids.append(i)
    # transformers 4.57.2-5.22 warn "incorrect regex pattern" on loading a local tokenizer of over
    # 100k tokens whose config.json lacks "transformers_version", taking it for a Mistral one saved
    # before their regex fix. Ours has llama.cpp's regexes; stamping the version that wrote these
    # files, as save_pretrained does, passes that check from 5.0 on (the ids do not change).
    return {"eos_token_ids": eos_ids, "chat_template": template, "transformers_version": transformers.__version__}
