"""GGUF -> HF conversion: tiny llama/qwen2/gemma3 GGUFs written the way llama.cpp does, converted back.

The tokenizer tests against another transformers than the installed one, laid over the venv:

    pip install --no-deps --target tf-5.17 transformers==5.17.0 huggingface-hub==1.33.0
    pip install --no-deps --target tf-4.57 transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.36.2
    PYTHONPATH=tf-5.17 python -m pytest -q tests/test_gguf.py -k tokenizer  # or tf-4.57

(tests/test_real_golden.py -k alone does the same on the real vocabularies.)
"""

import contextlib
import json
import logging
import re

import mlx.core as mx
import numpy as np
import pytest
from conftest import close
from gguf import GGMLQuantizationType as Q

from mlx_spec.errors import ConvertError, SourceError, UnsupportedError
from mlx_spec.make.gguf_reader import problems, read_header
from mlx_spec.make.gguf_weights import gguf_to_hf

HIDDEN, FFN, HEADS, KV_HEADS = 256, 512, 4, 2  # 256: K-quant blocks fit every weight row
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "Hello world, hello there. It's a test of the tokenizer!",
] * 10
SAMPLES = [
    "def add(a, b):\n    return a + b",
    "Hello world, it's the fox.",
    "x = np.zeros((3, 4))",
    "unseen: \u00fc\u00df\u4e2d \U0001f600",
    "  two  spaces\tand tab",
    "",
]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Weight types cycled over the 2-D tensors: quantizable ones via gguf.quants.quantize,
# K-quants and Q5_0 as random-but-valid block bytes.
QTYPES = [Q.F32, Q.Q8_0, Q.Q4_K, Q.Q4_0, Q.Q5_0, Q.Q6_K, Q.F16, Q.Q5_K, Q.BF16, Q.Q8_0]
F16_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q5_0: (0,)}  # byte offsets of fp16 scales
# transformers checks a tokenizer for Mistral's broken regex only above this many tokens, and in
# 4.57.2-5.22 warns "incorrect regex pattern" when the folder's config.json has no
# "transformers_version"; 4.57.3-4.57.6 also warn when it names a 4.x above 4.57.2.
MISTRAL_CHECK_VOCAB = 100_000
REGEX_WARNING = "incorrect regex pattern"


def permute(w, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (forward direction)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- tokenizers


def train_tokenizer(kind):
    """A small real BPE (vocab, merges, pipeline) of the given family, and its HF reference."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "gpt2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        pipe = dict(
            normalizer=normalizers.NFC(),
            pre_tokenizer=pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
            decoder=decoders.ByteLevel(),
        )
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        specials = (
            ["<unk>", "<s>", "</s>"]
            if kind == "llama"
            else ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        )
        specials += [f"<0x{b:02X}>" for b in range(256)]
        if kind == "llama":  # Llama 2's tokenizer.json pipeline
            pipe = dict(
                normalizer=normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
                decoder=decoders.Sequence(
                    [
                        decoders.Replace("\u2581", " "),
                        decoders.ByteFallback(),
                        decoders.Fuse(),
                        decoders.Strip(" ", 1, 0),
                    ]
                ),
            )
        else:
            pipe = dict(
                normalizer=normalizers.Replace(" ", "\u2581"),
                decoder=decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]),
            )
        alphabet = sorted(set("".join(CORPUS).replace(" ", "\u2581")) - {"\n"} | {"\u2581"})
    tok = Tokenizer(models.BPE())
    for k, v in pipe.items():
        setattr(tok, k, v)
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=len(specials) + len(alphabet) + 120,
            special_tokens=specials,
            initial_alphabet=alphabet,
            show_progress=False,
        ),
    )
    model = json.loads(tok.to_str())["model"]
    vocab, merges = model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    user = []
    if kind == "gemma":  # like Gemma 3: "\n" is a user-defined token
        tokens += [] if "\n" in tokens else ["\n"]
        user = ["\n"]
    # The HF reference: same vocab/merges/pipeline, bytes as plain vocab entries (byte fallback).
    ref = Tokenizer(
        models.BPE(
            {t: i for i, t in enumerate(tokens)},
            merges,
            fuse_unk=kind != "gpt2",
            byte_fallback=kind != "gpt2",
            unk_token=None if kind == "gpt2" else "<unk>",
        )
    )
    for k, v in pipe.items():
        setattr(ref, k, v)
    ctrl = [s for s in specials if not s.startswith("<0x")]
    ref.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ctrl])
    ref.add_tokens([AddedToken(s, special=False, normalized=False) for s in user])
    return dict(tokens=tokens, merges=merges, ctrl=ctrl, user=user, ref=ref)


def add_tokenizer_metadata(w, kind, tk, chat_template, pad_vocab_to=0):
    """The tokenizer keys llama.cpp writes; pad_vocab_to appends unreachable filler tokens (no
    merge makes them) up to that many, for a large vocabulary behind a tiny model."""
    tokens, types = list(tk["tokens"]), []
    for t in tokens:
        types.append(
            3
            if t in tk["ctrl"]
            else 6
            if re.fullmatch(r"<0x[0-9A-F]{2}>", t) and kind != "gpt2"
            else 4
            if t in tk["user"]
            else 1
        )
    filler = max(0, pad_vocab_to - len(tokens))
    tokens += [f"filler{i}" for i in range(filler)]
    types += [1] * filler
    if kind == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_merges([f"{a} {b}" for a, b in tk["merges"]])
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_pad_token_id(tokens.index("<|endoftext|>"))
        w.add_add_bos_token(False)
    else:
        # llama.cpp writes sentencepiece scores (merge rank order) and no merges.
        rank = {a + b: i for i, (a, b) in enumerate(tk["merges"])}
        w.add_token_scores([-float(rank.get(t, len(rank) + i)) for i, t in enumerate(tokens)])
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        if kind == "gemma":  # Gemma files spell whitespace-run tokens with real spaces
            for i, t in enumerate(tokens):
                if len(t) > 1 and not t.strip("\u2581"):
                    tokens[i], types[i] = " " * len(t), 4
        bos, eos = ("<s>", "</s>") if kind == "llama" else ("<bos>", "<eos>")
        w.add_bos_token_id(tokens.index(bos))
        w.add_eos_token_id(tokens.index(eos))
        w.add_unk_token_id(tokens.index("<unk>"))
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        if kind == "gemma":
            w.add_pad_token_id(0)
            w.add_add_space_prefix(False)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if chat_template:
        w.add_chat_template(chat_template)


# ---------------------------------------------------------------- weights and GGUF writing


def ref_config(arch, vocab, **extra):
    base = dict(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        rope_theta=10000.0,
        max_position_embeddings=512,
    )
    if arch == "llama":
        return dict(base, model_type="llama", tie_word_embeddings=False, head_dim=HIDDEN // HEADS, **extra)
    if arch == "qwen2":
        return dict(base, model_type="qwen2", tie_word_embeddings=True, **extra)
    return dict(
        base,
        model_type="gemma3_text",
        num_hidden_layers=6,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=4,
        sliding_window_pattern=6,
        rope_theta=1e6,
        **extra,
    )


def random_bytes(rng, shape, qtype):
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
    scales = rng.uniform(5e-5, 2e-4, raw.shape[:2] + (len(F16_FIELDS[qtype]),)).astype(np.float16)
    for j, off in enumerate(F16_FIELDS[qtype]):
        raw[:, :, off : off + 2] = scales[..., j : j + 1].view(np.uint8)
    return raw.reshape(shape[0], -1)


def encode(w2d, qtype, rng):
    """(bytes-or-array to write, the values the GGUF really holds) for an HF-layout 2-D weight."""
    from gguf import quants

    if qtype == Q.F32:
        return w2d, w2d
    if qtype == Q.F16:
        return w2d.astype(np.float16), w2d.astype(np.float16).astype(np.float32)
    if qtype == Q.Q8_K:  # no dequantizer exists: raw bytes only, for the unsupported-type test
        return rng.integers(0, 256, (w2d.shape[0], w2d.shape[1] // 256 * 292), dtype=np.uint8), w2d
    data = random_bytes(rng, w2d.shape, qtype) if qtype in F16_FIELDS else quants.quantize(w2d, qtype)
    return data, quants.dequantize(data, qtype)


def write_tiny_gguf(
    path, arch, *, seed=0, tied=None, chat_template=True, rope_freqs=False, qtypes=QTYPES, extra_kv=None, pad_vocab_to=0
):
    """Random HF-named weights -> GGUF the way llama.cpp writes it.

    Returns (config, reference weights as the GGUF holds them, qtypes, tokenizer, original weights).
    """
    import gguf
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    kind = {"llama": "llama", "qwen2": "gpt2", "gemma3": "gemma"}[arch]
    tk = train_tokenizer(kind)
    extra = {}
    if rope_freqs:
        extra["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    cfg = ref_config(arch, len(tk["tokens"]), **extra)
    if tied is not None:
        cfg["tie_word_embeddings"] = tied
    model_cls, args_cls = _get_classes(cfg)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(cfg))
    rng = np.random.default_rng(seed)
    hf = {k: np.array(v, dtype=np.float32) for k, v in tree_flatten(model.parameters())}
    if cfg.get("tie_word_embeddings", True):
        hf.pop("lm_head.weight", None)
    for k in hf:  # sharper weights and non-trivial norms/biases, so every mistake shows in the logits
        unit = arch != "gemma3" and k.endswith("norm.weight")  # Gemma norms are offsets from 1
        hf[k] = hf[k] * 4 if hf[k].ndim == 2 else rng.normal(unit, 0.3, hf[k].shape).astype(np.float32)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "llama":
        w.add_rope_dimension_count(HIDDEN // HEADS)
    if arch == "gemma3":
        w.add_key_length(64)
        w.add_value_length(64)
        w.add_sliding_window(cfg["sliding_window"])
    template = (
        {
            "gpt2": CHATML,
            "llama": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
            "gemma": None,
        }[kind]
        if chat_template
        else None
    )
    add_tokenizer_metadata(w, kind, tk, template, pad_vocab_to)
    if extra_kv:
        extra_kv(w, tk)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg["num_hidden_layers"])
    ref, types, i = {}, {}, 0
    for k in sorted(hf):
        base, suffix = k.rsplit(".", 1)
        gname = name_map.get_name(base) + "." + suffix
        v = hf[k]
        if v.ndim == 2:
            qtype = qtypes[i % len(qtypes)]
            i += 1
            data, ref[k] = encode(v, qtype, rng)
        else:
            qtype, data, ref[k] = Q.F32, v, v
        if arch == "llama" and re.search(r"\.(attn_q|attn_k)\.", gname):  # llama.cpp's RoPE row order
            data = permute(data, HEADS, HEADS if ".attn_q." in gname else KV_HEADS)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            data = data + 1.0  # llama.cpp stores Gemma norms as 1 + w
        raw = qtype not in (Q.F32, Q.F16)
        w.add_tensor(gname, np.ascontiguousarray(data), raw_dtype=qtype if raw else None)
        types[k] = qtype
    if rope_freqs:
        r = cfg["rope_scaling"]
        inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, 64, 2) / 64)
        wl = 2 * np.pi / inv
        smooth = (8192 / wl - 1) / 3
        mid = 1 / ((1 - smooth) / r["factor"] + smooth)
        f = np.where(wl < 8192 / 4, 1, np.where(wl > 8192, r["factor"], mid))
        w.add_tensor("rope_freqs.weight", f.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, ref, types, tk, hf


def ref_logits(cfg, weights, ids):
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    w = model.sanitize({k: mx.array(v) for k, v in weights.items()})
    model.load_weights(list(w.items()))
    return model(mx.array([ids]))


def converted_logits(folder, ids):
    import mlx_lm

    model, tok = mlx_lm.load(str(folder))
    return model(mx.array([ids])), tok


IDS = [5, 17, 42, 3, 99, 120, 7, 250, 11, 64, 31, 200]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    variants = {"llama": dict(rope_freqs=True), "qwen2": {}, "gemma3": dict(chat_template=False)}
    for arch, kw in variants.items():
        path = root / f"{arch}.gguf"
        cfg, ref, types, tk, orig = write_tiny_gguf(path, arch, **kw)
        folder = root / f"{arch}-hf"
        folder.mkdir()
        got_cfg = gguf_to_hf(path, folder)
        out[arch] = dict(path=path, cfg=cfg, ref=ref, types=types, tk=tk, orig=orig, folder=folder, got=got_cfg)
    return out


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_tensors_names_shapes_values(cases, arch):
    c = cases[arch]
    got = {}
    for f in c["folder"].glob("model*.safetensors"):
        got.update(mx.load(str(f)))
    assert sorted(got) == sorted(c["ref"])
    for k, want in c["ref"].items():
        g = np.array(got[k])
        assert g.shape == want.shape, k
        if c["types"][k] == Q.F32 and arch == "gemma3" and k.endswith("norm.weight"):
            np.testing.assert_allclose(g, want, rtol=0, atol=2**-23, err_msg=k)  # (w + 1) - 1 rounds
        elif c["types"][k] == Q.F32:
            np.testing.assert_array_equal(g, want, err_msg=k)
        else:
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7, err_msg=k)
        if c["types"][k] in (Q.Q8_0, Q.F16, Q.BF16):  # and close to the original float weights
            tol = {Q.Q8_0: 0.02, Q.F16: 1e-3, Q.BF16: 1e-2}[c["types"][k]]
            assert np.abs(g - c["orig"][k]).max() <= tol * np.abs(c["orig"][k]).max(), k
    assert {Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16} <= set(c["types"].values())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_config_and_logits_match_original(cases, arch):
    c = cases[arch]
    got = json.loads((c["folder"] / "config.json").read_text())
    assert got == c["got"]
    for key, value in c["cfg"].items():
        assert got[key] == pytest.approx(value) if isinstance(value, float) else got[key] == value, key
    logits, _ = converted_logits(c["folder"], IDS)
    want = ref_logits(c["cfg"], c["ref"], IDS)
    assert logits.shape == want.shape
    assert close(logits, want), float(mx.abs(logits - want).max())


def test_missing_unpermute_or_norm_shift_would_be_caught(cases, tmp_path, monkeypatch):
    """The logits check has teeth: skipping either llama.cpp fix-up changes the logits."""
    import mlx_spec.make.gguf_weights as g

    monkeypatch.setattr(g, "_unpermute", lambda w, n: w)
    monkeypatch.setattr(g, "_fix_tensor", lambda arch, name, w, cfg: w)
    for arch in ("llama", "gemma3"):
        c = cases[arch]
        out = tmp_path / arch
        out.mkdir()
        gguf_to_hf(c["path"], out)
        logits, _ = converted_logits(out, IDS)
        assert not mx.allclose(logits, ref_logits(c["cfg"], c["ref"], IDS), atol=1e-2).item()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_tokenizer_round_trip_and_matches_reference(cases, arch):
    from transformers import AutoTokenizer

    c = cases[arch]
    tok = AutoTokenizer.from_pretrained(str(c["folder"]))
    ref = c["tk"]["ref"]
    bos = [] if arch == "qwen2" else [ref.token_to_id("<s>" if arch == "llama" else "<bos>")]
    for s in SAMPLES + CORPUS[:6]:
        ids = tok.encode(s)
        assert ids == bos + ref.encode(s, add_special_tokens=False).ids, s
        assert tok.decode(ids, skip_special_tokens=True) == s
    files = {p.name for p in c["folder"].iterdir()}
    assert {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "config.json",
    } <= files


@contextlib.contextmanager
def transformers_log():
    """The messages transformers logs at WARNING and above inside the block (its logger does not
    propagate to pytest's caplog, and TRANSFORMERS_VERBOSITY could silence it)."""
    log, messages = logging.getLogger("transformers"), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    try:
        yield messages
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def regex_warning_expected(stamped: bool) -> bool:
    """Whether the installed transformers warns on a rebuilt folder with (or without) the
    "transformers_version" stamp in config.json (see MISTRAL_CHECK_VOCAB)."""
    import transformers
    from packaging.version import Version

    v = Version(transformers.__version__)
    if stamped:
        return Version("4.57.3") <= v < Version("5.0")
    return Version("4.57.2") <= v < Version("5.23")


def regex_warned(folder) -> bool:
    """Whether loading the tokenizer in `folder` logs transformers' "incorrect regex pattern" warning."""
    from transformers import AutoTokenizer

    with transformers_log() as messages:
        AutoTokenizer.from_pretrained(str(folder))
    return any(REGEX_WARNING in m for m in messages)


def test_tokenizer_with_big_vocab_loads_without_regex_warning(tmp_path):
    """A Qwen-sized vocabulary: config.json names the transformers that wrote the files, so its
    Mistral-regex check passes (except in 4.57.3-4.57.6, which fail their own saves); the ids are
    the reference's. Without the stamp exactly the affected versions warn: the log is really read."""
    import transformers
    from transformers import AutoTokenizer

    path, out = tmp_path / "big.gguf", tmp_path / "out"
    _, _, _, tk, _ = write_tiny_gguf(path, "qwen2", pad_vocab_to=MISTRAL_CHECK_VOCAB + 100)
    out.mkdir()
    gguf_to_hf(path, out)
    config = json.loads((out / "config.json").read_text())
    assert config["transformers_version"] == transformers.__version__
    assert regex_warned(out) == regex_warning_expected(stamped=True)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert len(tok) > MISTRAL_CHECK_VOCAB
    for s in SAMPLES + CORPUS[:6]:
        assert tok.encode(s) == tk["ref"].encode(s, add_special_tokens=False).ids, s
    del config["transformers_version"]
    (out / "config.json").write_text(json.dumps(config))
    assert regex_warned(out) == regex_warning_expected(stamped=False)


def test_special_tokens_and_chat_templates(cases):
    import mlx_lm

    _, tok = mlx_lm.load(str(cases["qwen2"]["folder"]))
    msgs = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids  # special tokens stay whole
    gen = json.loads((cases["qwen2"]["folder"] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    # Gemma GGUF without a template: the built-in Gemma turn format is used.
    _, gtok = mlx_lm.load(str(cases["gemma3"]["folder"]))
    gtext = gtok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert gtext == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    assert gtok.encode(gtext, add_special_tokens=False)[0] == gtok.bos_token_id
    _, ltok = mlx_lm.load(str(cases["llama"]["folder"]))
    assert ltok.apply_chat_template(msgs, tokenize=False) == "<s>[user] hi\n"
    tcfg = json.loads((cases["llama"]["folder"] / "tokenizer_config.json").read_text())
    assert tcfg["add_bos_token"] is True and tcfg["chat_template"].startswith("{{ bos_token }}")


def test_llama3_rope_freqs_become_rope_scaling(cases):
    got = cases["llama"]["got"]
    assert got["rope_scaling"] == cases["llama"]["cfg"]["rope_scaling"]
    assert got["tie_word_embeddings"] is False and cases["qwen2"]["got"]["tie_word_embeddings"] is True


def test_header_reader_agrees_with_gguf_reader(cases):
    import gguf

    for c in cases.values():
        ours, theirs = read_header(c["path"]), gguf.GGUFReader(str(c["path"]))
        assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
        for a, b in zip(ours.tensors, theirs.tensors):
            assert (a.offset, a.nbytes, a.qtype, list(a.shape)) == (
                b.data_offset,
                b.n_bytes,
                int(b.tensor_type),
                [int(x) for x in b.shape],
            )
        for key, field in theirs.fields.items():
            if key.startswith("GGUF."):
                continue
            mine, contents = ours.fields[key], field.contents()
            if isinstance(mine, np.ndarray):
                mine = mine.tolist()
            assert mine == pytest.approx(contents) if isinstance(contents, float) else mine == contents, key


def test_other_dtypes(cases, tmp_path):
    c = cases["qwen2"]
    cfg = gguf_to_hf(c["path"], tmp_path, dtype="bfloat16")
    assert cfg["torch_dtype"] == "bfloat16"
    w = mx.load(str(tmp_path / "model.safetensors"))
    assert all(v.dtype == mx.bfloat16 for v in w.values())
    with pytest.raises(ConvertError, match="int8"):
        gguf_to_hf(c["path"], tmp_path, dtype="int8")


# ---------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    with pytest.raises(SourceError, match="no such GGUF file"):
        gguf_to_hf(tmp_path / "nope.gguf", tmp_path)
    with pytest.raises(SourceError, match="nope.gguf"):
        read_header(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    with pytest.raises(SourceError, match="not a GGUF file"):
        gguf_to_hf(p, tmp_path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(SourceError, match="not a GGUF"):
        read_header(tmp_path / "empty.gguf")
    # Right magic and version, garbage after: a corrupt header, reported as such.
    rng = np.random.default_rng(0)
    header = b"GGUF" + np.array([3], "<u4").tobytes() + np.array([1, 3], "<u8").tobytes()
    (tmp_path / "garbage.gguf").write_bytes(header + rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())
    with pytest.raises(SourceError, match="garbage.gguf: (truncated or )?corrupt GGUF header"):
        read_header(tmp_path / "garbage.gguf")
    (tmp_path / "v1.gguf").write_bytes(b"GGUF\x01\x00\x00\x00" + bytes(100))
    with pytest.raises(UnsupportedError, match="version 1"):
        gguf_to_hf(tmp_path / "v1.gguf", tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.02, 30 / 100_000])
def test_truncated(cases, tmp_path, keep):
    data = cases["qwen2"]["path"].read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: max(30, int(len(data) * keep))])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SourceError, match="truncated") as e:
        gguf_to_hf(p, out)
    assert "cut.gguf" in str(e.value) and "\n" not in str(e.value)
    assert not list(out.iterdir())  # failed before writing anything


def test_unsupported_architecture(tmp_path):
    import gguf

    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match="architecture 'mamba' is not supported"):
        gguf_to_hf(p, tmp_path)
    assert "mamba" in problems(read_header(p))[0]


def test_unsupported_tensor_type(tmp_path):
    p = tmp_path / "q8k.gguf"
    write_tiny_gguf(p, "qwen2", qtypes=[Q.F32, Q.Q8_K])  # Q8_K: an intermediate type, no dequantizer
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsupportedError, match="Q8_K"):
        gguf_to_hf(p, out)
    assert "Q8_K" in problems(read_header(p))[0]


def test_embedded_hf_tokenizer_json_is_used(tmp_path):
    p = tmp_path / "hfjson.gguf"
    marker = lambda w, tk: w.add_string("tokenizer.huggingface.json", tk["ref"].to_str())  # noqa: E731
    _, _, _, tk, _ = write_tiny_gguf(p, "qwen2", extra_kv=marker)
    out = tmp_path / "out"
    out.mkdir()
    gguf_to_hf(p, out)
    saved = json.loads((out / "tokenizer.json").read_text())
    assert saved["model"] == json.loads(tk["ref"].to_str())["model"]


def test_split_gguf_part_is_refused(tmp_path):
    p = tmp_path / "part.gguf"
    write_tiny_gguf(p, "qwen2", extra_kv=lambda w, tk: w.add_uint16("split.count", 2))
    with pytest.raises(UnsupportedError, match="split GGUF"):
        gguf_to_hf(p, tmp_path)
