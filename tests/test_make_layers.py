"""Layer-drop writes folders mlx-lm loads: per-block config lists follow the kept blocks, attention types hold."""

import json

import pytest
from conftest import make_model, plain_greedy
from mlx_lm import load

from mlx_spec.errors import ConvertError
from mlx_spec.make.layers import keep_layer_indices, kept_config
from mlx_spec.make.resolve import convert

N = 6
SLIDING, FULL = "sliding_attention", "full_attention"
# The per-block fields real HF configs carry (transformers checks len(layer_types) == num_hidden_layers).
REAL_FIELDS = {
    # mlx-lm's llama honours layer_types, so mixed types show each kept block keeps its own
    "llama": dict(layer_types=[SLIDING, FULL, SLIDING, FULL, SLIDING, FULL], sliding_window=8),
    "qwen2": dict(layer_types=[FULL] * N, use_sliding_window=False, max_window_layers=N, sliding_window=None),
    # gemma3: every 3rd block global, as HF writes it (mlx-lm reads only the pattern)
    "gemma3": dict(
        layer_types=[FULL if (i + 1) % 3 == 0 else SLIDING for i in range(N)],
        sliding_window_pattern=3,
        sliding_window=8,
    ),
}
# (keep_layers, layers) cases per arch; gemma3's [0, 2, 3] keeps its types only under a new pattern (2)
DROPS = {
    "llama": [(3, None), (None, [0, 1, 2])],
    "qwen2": [(3, None), (None, [1, 4])],
    "gemma3": [(3, None), (None, [0, 2, 3]), (None, [2, 5])],
}
REFUSED = [[0, 1], [2, 3, 4]]  # gemma3 blocks whose types no sliding_window_pattern reproduces


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Six-block tiny models of each architecture whose config.json carries the real per-block fields."""
    root = tmp_path_factory.mktemp("layered")
    out = {}
    for seed, (arch, fields) in enumerate(REAL_FIELDS.items()):
        folder = make_model(root / arch, arch, seed=seed, layers=N, scale=4.0)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **fields}, indent=2))
        out[arch] = folder
    return out


def attention_types(model) -> list:
    """Each block's attention as mlx-lm builds it: True where it uses the sliding window."""
    return [
        bool(getattr(layer, "use_sliding", False) or getattr(layer.self_attn, "is_sliding", False))
        for layer in model.layers
    ]


def generate(model, tokenizer, n: int = 6) -> list:
    """n greedy tokens after a prompt longer than the sliding window, so the rotating caches wrap."""
    return plain_greedy(model, tokenizer.encode("def add(a, b):\n    return a + b\nfor i in range(10):\n"), n)


@pytest.mark.parametrize("arch,keep,layers", [(a, k, kept) for a, cases in DROPS.items() for k, kept in cases])
def test_layer_dropped_folder_loads_generates_and_keeps_attention_types(sources, tmp_path, arch, keep, layers):
    out = convert(
        str(sources[arch]),
        tmp_path / "out",
        dtype="float32",
        quantize=4,
        group_size=32,
        keep_layers=keep,
        layers=layers,
    )
    kept = layers or keep_layer_indices(N, keep)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == len(kept)
    assert cfg["layer_types"] == [REAL_FIELDS[arch]["layer_types"][i] for i in kept]
    model, tokenizer = load(str(out))
    original, _ = load(str(sources[arch]))
    assert attention_types(model) == [attention_types(original)[i] for i in kept]
    assert len(generate(model, tokenizer)) == 6


@pytest.mark.parametrize("layers", REFUSED)
def test_gemma3_drop_that_would_change_attention_is_refused_before_writing(sources, tmp_path, layers):
    with pytest.raises(ConvertError, match="attention types") as e:
        convert(str(sources["gemma3"]), tmp_path / "out", dtype="float32", layers=layers)
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_gemma_3_270m_keep_6_keeps_its_pattern_and_keep_9_is_refused():
    """The real Gemma 3 270M shape: 18 blocks, every 6th global (HF writes both fields)."""
    cfg = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "sliding_window_pattern": 6,
        "layer_types": [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(18)],
    }
    kept = keep_layer_indices(18, 6)
    assert kept == [0, 3, 7, 10, 14, 17]
    got = kept_config(cfg, kept)
    assert got["num_hidden_layers"] == 6 and got["sliding_window_pattern"] == 6
    assert got["layer_types"] == [SLIDING] * 5 + [FULL]
    assert cfg["num_hidden_layers"] == 18 and len(cfg["layer_types"]) == 18  # the input is not changed
    with pytest.raises(ConvertError, match="sliding_window_pattern"):
        kept_config(cfg, keep_layer_indices(18, 9))  # globals 11 and 17 land at kept positions 5 and 8


def test_per_block_lists_of_the_wrong_length_and_unbuildable_configs_are_refused():
    base = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": 100,
    }
    with pytest.raises(ConvertError, match="layer_types has 3 entries for 4 blocks"):
        kept_config({**base, "layer_types": [FULL] * 3}, [0, 1])
    # mlx-lm's llama needs one full-attention block to take its mask from
    with pytest.raises(ConvertError, match="cannot build"):
        kept_config({**base, "layer_types": [SLIDING, FULL, SLIDING, FULL], "sliding_window": 8}, [0, 2])
