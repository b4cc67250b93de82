"""Models of real shapes with random weights (`random:NAME`): what a forward pass costs does not depend on the values.

`random:tiny` is a small Qwen2 model, written once into the cache as a folder with a tokenizer trained on the
calibration text, so every command can load it: on it the generation loop, not the model, decides the speed
(`mlx-spec bench run overhead`). The other shapes (configs as their Hugging Face `config.json` files give them)
are built in memory only, at the precision asked, for timing passes (`mlx-spec bench run predict`).
"""

import json
from pathlib import Path
from typing import Any

from ..errors import SourceError
from .paths import home

PREFIX = "random:"
_QWEN = dict(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        _QWEN,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1024,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    "qwen2.5-0.5b": dict(
        _QWEN,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        _QWEN,
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        _QWEN,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-14b": dict(
        _QWEN,
        hidden_size=5120,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=13824,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-32b": dict(
        _QWEN,
        hidden_size=5120,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=27648,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "llama-2-7b": dict(
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}
SEED = 0


def shape(spec: str) -> str | None:
    """The shape a `random:NAME` spec names (None for any other spec); an unknown one is a one-line error."""
    if not spec.startswith(PREFIX):
        return None
    name = spec[len(PREFIX) :]
    if name not in SHAPES:
        raise SourceError(f"unknown random shape '{name}' (known: {', '.join(SHAPES)})")
    return name


def build(name: str, dtype: str = "bfloat16", quantize: str | None = None):
    """The model of shape `name` with random weights (seeded), in `dtype`, optionally quantized (int4, int8, ...),
    built in memory: every weight is made lazily and evaluated once at its final precision."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes

    from .quant import FP_MODES, parse_quantize

    config = dict(SHAPES[name])
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(SEED)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda w: w.astype(getattr(mx, dtype)), model.parameters()))
    if quantize:
        bits, mode = parse_quantize(quantize)
        group = FP_MODES[mode][0] if mode in FP_MODES else 64
        nn.quantize(model, group_size=group, bits=bits, mode=mode)  # type: ignore[arg-type]  # mlx: `int = None`
    mx.eval(model.parameters())
    return model


def folder(name: str) -> Path:
    """The cached folder of a small random shape (written once: float32 weights, a tokenizer trained on the
    calibration text, a ChatML template); big shapes are for `build` only."""
    config = SHAPES[name]
    if config["vocab_size"] > 4096:
        raise SourceError(f"random:{name} is for timing passes (mlx-spec bench run predict), not a model folder")
    out = home() / "models" / f"random-{name}"
    if (out / "config.json").is_file():
        return out
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tmp = out.with_name("." + out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(config["vocab_size"])
    tokenizer.save_pretrained(str(tmp))
    model = build(name, "float32")
    mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    (tmp / "config.json").write_text(
        json.dumps(
            dict(
                config,
                eos_token_id=eos,
                architectures=["Qwen2ForCausalLM"],
                mlx_spec={"source": f"{PREFIX}{name}", "seed": SEED},
            ),
            indent=1,
        )
    )
    tmp.replace(out)
    return out


def _tokenizer(vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens trained on the calibration text, with ChatML's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .importance import calibration_texts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bars go to stdout, where `fetch` prints the folder and `serve` its URL
    )
    tok.train_from_iterator(calibration_texts(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast
