"""Turn a local llama/qwen2/gemma3 GGUF file into a Hugging Face-format folder that mlx-lm loads."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ConvertError, SourceError, UnsupportedError
from .gguf_reader import GGUFFile, TensorInfo, check_bounds, problems, read_header
from .gguf_tokenizer import write_tokenizer
from .progress import progress

_SHARD_BYTES = 2 << 30  # bounds the peak memory of one shard held before writing
_CHUNK_BYTES = 64 << 20  # dequantize this much output at a time, not a whole tensor's temporaries
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Per-block GGUF tensor names -> HF module names (suffix .weight/.bias is kept).
_LLAMA_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_NAMES = {
    "llama": _LLAMA_BLOCK,
    "qwen2": _LLAMA_BLOCK,
    # Gemma 3 has four norms per block; its ffn_norm is the *pre*-feed-forward one.
    "gemma3": {
        **_LLAMA_BLOCK,
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    },
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors llama.cpp adds that have no HF weight (rope_freqs is folded into the config instead).
_SKIPPED = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_rot_embd\.weight)$")


def _require(info: GGUFFile, key: str):
    v = info.get(key)
    if v is None:
        raise SourceError(f"{info.path}: metadata key {key.replace('{arch}', info.architecture)} is missing")
    return v


def _uniform(info: GGUFFile, key: str, default=None) -> int:
    """An int that llama.cpp may store per layer; we only support equal values."""
    v = info.get(key, default)
    if isinstance(v, (list, np.ndarray)):
        if len(set(int(x) for x in v)) != 1:
            raise UnsupportedError(
                f"{info.path}: per-layer {key.replace('{arch}', info.architecture)} values differ; not supported"
            )
        v = v[0]
    return int(v)


def _rope_scaling(info: GGUFFile, head_dim: int, theta: float) -> dict | None:
    kind = info.get("{arch}.rope.scaling.type")
    factor = info.get("{arch}.rope.scaling.factor")
    orig = info.get("{arch}.rope.scaling.original_context_length")
    freqs = next((t for t in info.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        return _llama3_scaling(info, freqs, head_dim, theta)
    if kind in (None, "none") or factor in (None, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(factor)}
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        for k in ("beta_fast", "beta_slow"):
            if (v := info.get("{arch}.rope.scaling.yarn_" + k)) is not None:
                out[k] = float(v)
        return out
    raise UnsupportedError(f"{info.path}: RoPE scaling type {kind!r} is not supported")


def _llama3_scaling(info: GGUFFile, freqs: TensorInfo, head_dim: int, theta: float) -> dict:
    """Llama 3.1+ GGUFs keep only the per-frequency factors; recover HF's llama3 rope_scaling.

    llama.cpp computes rope_freqs from (factor, low/high_freq_factor, original context);
    we rebuild it from the standard parameter sets and keep the one that reproduces it.
    """
    got = _dequantize(info, freqs).ravel()
    factor = float(got.max())
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    for low, high, orig in ((1.0, 4.0, 8192),):
        smooth = (orig / wavelen - low) / (high - low)
        want = np.where(
            wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, 1 / ((1 - smooth) / factor + smooth))
        )
        if want.shape == got.shape and np.allclose(want, got, rtol=1e-3):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": orig,
            }
    raise UnsupportedError(f"{info.path}: rope_freqs.weight does not match llama3 RoPE scaling")


def _build_config(info: GGUFFile, dtype: str) -> dict:
    arch = info.architecture
    names = {t.name for t in info.tensors}
    embd = next((t for t in info.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise SourceError(f"{info.path}: no token_embd.weight tensor")
    hidden = int(_require(info, "{arch}.embedding_length"))
    heads = _uniform(info, "{arch}.attention.head_count")
    kv_heads = _uniform(info, "{arch}.attention.head_count_kv", heads)
    head_dim = int(
        info.get("{arch}.attention.key_length") or info.get("{arch}.rope.dimension_count") or hidden // heads
    )
    theta = float(info.get("{arch}.rope.freq_base", 10000.0))
    tok = lambda k: info.get(f"tokenizer.ggml.{k}_token_id")  # noqa: E731
    cfg: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": _uniform(info, "{arch}.feed_forward_length"),
        "num_hidden_layers": int(_require(info, "{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(info.get("{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "max_position_embeddings": int(info.get("{arch}.context_length", 4096)),
        "vocab_size": int(embd.shape[-1]),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": dtype,
        "bos_token_id": None if tok("bos") is None else int(tok("bos")),
        "eos_token_id": None if tok("eos") is None else int(tok("eos")),
    }
    if (pad := tok("padding")) is not None:
        cfg["pad_token_id"] = int(pad)
    rope_scaling = _rope_scaling(info, head_dim, theta)
    if arch == "llama":
        cfg.update(
            model_type="llama",
            architectures=["LlamaForCausalLM"],
            hidden_act="silu",
            attention_bias="blk.0.attn_q.bias" in names,
            mlp_bias=False,
            rope_scaling=rope_scaling,
        )
    elif arch == "qwen2":
        if head_dim != hidden // heads:
            raise UnsupportedError(f"{info.path}: qwen2 with head_dim {head_dim} != hidden/heads")
        cfg.update(
            model_type="qwen2",
            architectures=["Qwen2ForCausalLM"],
            hidden_act="silu",
            use_sliding_window=False,
            rope_scaling=rope_scaling,
        )
    else:  # gemma3 (problems() has ruled out the rest)
        n = cfg["num_hidden_layers"]
        # llama.cpp hard-codes these for gemma3: every 6th layer is global, local layers use
        # RoPE base 10k, and only the 27B (62 layers) scales queries by hidden/heads.
        pattern = 6
        cfg.update(
            model_type="gemma3_text",
            architectures=["Gemma3ForCausalLM"],
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=hidden // heads if n == 62 else head_dim,
            sliding_window=int(info.get("{arch}.attention.sliding_window", 4096)),
            sliding_window_pattern=pattern,
            layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)],
            rope_local_base_freq=10000.0,
            rope_scaling=rope_scaling,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        )
    return cfg


def _hf_name(arch: str, name: str) -> str | None:
    base, _, suffix = name.rpartition(".")
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _BLOCK_NAMES[arch]:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[arch][m.group(2)]}.{suffix}"
    return None


def _dequantize(info: GGUFFile, t: TensorInfo) -> np.ndarray:
    """float32 numpy array in HF shape, dequantized a row chunk at a time to bound temporaries."""
    qtype = GGMLQuantizationType(t.qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    row_elems = t.shape[0]
    row_bytes = row_elems // block * type_size
    n_rows = t.nbytes // row_bytes
    raw = np.memmap(info.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(n_rows, row_bytes))
    out = np.empty((n_rows, row_elems), dtype=np.float32)
    step = max(1, _CHUNK_BYTES // (row_elems * 4))
    try:
        for i in range(0, n_rows, step):
            chunk = np.asarray(raw[i : i + step])
            if qtype == GGMLQuantizationType.F64:
                out[i : i + step] = chunk.view("<f8")
            else:
                out[i : i + step] = quants.dequantize(chunk, qtype).reshape(-1, row_elems)
    except (NotImplementedError, KeyError) as e:
        raise UnsupportedError(f"{info.path}: cannot dequantize {t.name} ({qtype.name}): {e}") from None
    del raw
    return out.reshape(t.np_shape)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`, which interleaves Q/K rows for its RoPE layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _fix_tensor(arch: str, name: str, w: np.ndarray, cfg: dict) -> np.ndarray:
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        heads = cfg["num_attention_heads"] if ".attn_q." in name else cfg["num_key_value_heads"]
        return _unpermute(w, heads)
    if arch == "gemma3" and name.endswith("norm.weight"):
        return w - 1.0  # llama.cpp stores Gemma's (1 + w); mlx-lm's RMSNorm adds the 1 itself
    return w


def _plan_tensors(info: GGUFFile, arch: str) -> list[tuple[TensorInfo, str]]:
    plan, unknown = [], []
    for t in info.tensors:
        hf = _hf_name(arch, t.name)
        if hf is None:
            if not _SKIPPED.match(t.name):
                unknown.append(t.name)
            continue
        plan.append((t, hf))
    if unknown:
        raise UnsupportedError(
            f"{info.path}: unexpected {arch} tensors {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}"
        )
    return plan


def _write_weights(info: GGUFFile, plan, cfg: dict, out_dir: Path, dtype: str) -> None:
    import mlx.core as mx

    arch = info.architecture
    mx_dtype = getattr(mx, dtype)
    shards: list[list] = [[]]
    used = 0
    for t, hf in plan:  # group tensors into shards by their output size
        n = math.prod(t.shape) * _DTYPES[dtype]
        if shards[-1] and used + n > _SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append((t, hf))
        used += n
    weight_map, total = {}, 0
    with progress(total=len(plan), desc=f"dequantizing {info.path.name}", unit="tensor") as bar:
        for i, shard in enumerate(shards):
            fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            arrays = {}
            for t, hf in shard:
                w = _fix_tensor(arch, t.name, _dequantize(info, t), cfg)
                arrays[hf] = mx.array(w).astype(mx_dtype)
                del w
                mx.eval(arrays[hf])
                weight_map[hf] = fname
                total += arrays[hf].nbytes
                bar.update()
            mx.save_safetensors(str(out_dir / fname), arrays, metadata={"format": "pt"})
            del arrays
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def gguf_to_hf(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> dict:
    """Write config.json, model.safetensors (HF tensor names), tokenizer.json,
    tokenizer_config.json (with chat_template), special_tokens_map.json and
    generation_config.json into out_dir (which exists and is empty). Returns the config dict.

    Raises SourceError (missing/corrupt/truncated file), UnsupportedError (architecture or
    tensor type) or ConvertError (bad dtype).
    """
    if dtype not in _DTYPES:
        raise ConvertError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    info = read_header(gguf_path)
    check_bounds(info)
    if found := problems(info):
        raise UnsupportedError(f"{gguf_path}: {found[0]}")
    cfg = _build_config(info, dtype)
    plan = _plan_tensors(info, info.architecture)
    tok = write_tokenizer(info, out_dir, cfg)  # before weights: a bad vocab fails fast
    _write_weights(info, plan, cfg, out_dir, dtype)
    cfg["transformers_version"] = tok["transformers_version"]
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": tok["eos_token_ids"]}
    if cfg.get("pad_token_id") is not None:
        gen["pad_token_id"] = cfg["pad_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return cfg
