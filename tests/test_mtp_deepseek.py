"""DeepSeek-style MTP ("nextn") layers (DeepSeek-V3, GLM-4.5+, GLM-4.7-Flash: `model.layers.<num_hidden_layers>.*`):
the module agrees with mlx-vlm's GLM nextn drafter run over mlx-vlm's own decoder layer of the family, on the weights
mlx-vlm's GLM-4.7-Flash splitter takes from the checkpoint (and a misplaced input, norm or fed-back state does not);
`--draft mtp` equals plain decoding alone and beside other rows; `convert` keeps the layer and `mtp` runs it from
the converted folder."""

import importlib
import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import make_model, make_tokenizer, plain_greedy, run_cli, spec
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.base import create_attention_mask
from test_mtp import compare

from mlx_spec.errors import MlxSpecError
from mlx_spec.models import mtp
from mlx_spec.named import load_model, make_drafter

MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
OWN = {"deepseek_v3": True, "glm4_moe": False, "glm4_moe_lite": True}  # ships its own embed_tokens and output head
DECODERS = {
    "deepseek_v3": "DeepseekV3DecoderLayer",
    "glm4_moe": "DecoderLayer",
    "glm4_moe_lite": "Glm4MoeLiteDecoderLayer",
}  # mlx-vlm's classes, in mlx_vlm.models.<type>.language
HF = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
    "head": "shared_head.head",
    "embed_tokens": "embed_tokens",
}  # the module's names -> the checkpoint's


def tiny_nextn_config(arch: str, vocab_size: int) -> dict:
    """Small but structurally real configs: MoE with a shared expert and sigmoid routing, MLA where the family has
    it, one nextn layer."""
    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=vocab_size,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        num_nextn_predict_layers=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        first_k_dense_replace=1,
        moe_layer_freq=1,
        attention_bias=False,
    )
    if arch == "deepseek_v3":  # mlx-lm drops the nextn layer by DeepSeek-V3's own name, model.layers.61: 61 blocks
        return dict(
            base,
            **MLA,
            model_type=arch,
            architectures=["DeepseekV3ForCausalLM"],
            num_hidden_layers=61,
            first_k_dense_replace=60,
            intermediate_size=32,
        )
    if arch == "glm4_moe_lite":
        return dict(base, **MLA, model_type=arch, architectures=["Glm4MoeLiteForCausalLM"], num_hidden_layers=3)
    if arch == "glm4_moe":
        return dict(
            base,
            model_type=arch,
            architectures=["Glm4MoeForCausalLM"],
            num_hidden_layers=3,
            head_dim=16,
            num_key_value_heads=2,
            use_qk_norm=True,
            attention_bias=True,
            partial_rotary_factor=0.5,
        )
    raise ValueError(arch)


def hf_layout(weights: dict, prefix: str, config: dict) -> dict:
    """MLX weights as these checkpoints store them: one array per expert, MLA's `kv_b_proj` fused
    (heads * (nope + v), kv_lora); each key after `prefix`."""
    out = {}
    for k, v in weights.items():
        if ".switch_mlp." in k:
            base, proj = k.split(".switch_mlp.")
            out.update({f"{prefix}{base}.experts.{i}.{proj}": v[i] for i in range(v.shape[0])})
        elif k.endswith("self_attn.embed_q.weight"):  # (heads, kv_lora, nope) beside unembed_out (heads, v, kv_lora)
            base = k[: -len("embed_q.weight")]
            fused = mx.concatenate([v.swapaxes(-1, -2), weights[base + "unembed_out.weight"]], axis=1)
            out[f"{prefix}{base}kv_b_proj.weight"] = fused.reshape(-1, config["kv_lora_rank"])
        elif not k.endswith("self_attn.unembed_out.weight"):
            out[prefix + k] = v
    return out


def nextn_layout(module: mtp.MTP, config: dict) -> dict:
    """A module's weights as the checkpoint's nextn layer `model.layers.<num_hidden_layers>.*`."""
    renamed = {}
    for k, v in tree_flatten(module.parameters()):
        top, _, rest = k.partition(".")
        renamed[rest.partition(".")[2] if top == "layers" else f"{HF[top]}.{rest}"] = v
    return hf_layout(renamed, f"model.layers.{config['num_hidden_layers']}.", config)


def make_checkpoint(folder, arch: str, seed: int = 5, scale: float = 4.0):
    """A tiny checkpoint of `arch` in the published layout whose nextn layer carries random weights (exact in
    bfloat16, which mlx-vlm's splitter casts them to)."""
    folder.mkdir(parents=True)
    tok = make_tokenizer(folder)
    config = dict(tiny_nextn_config(arch, len(tok)), eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    arch_module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    target = arch_module.Model(arch_module.ModelArgs.from_dict(config))
    target.update(
        tree_map(lambda w: w * scale if w.ndim > 1 else w + 0.1 * mx.random.normal(w.shape), target.parameters())
    )  # norms that are not all ones: a misplaced norm shows
    module = mtp.MTP(target, head=OWN[arch], embed=OWN[arch])
    module.update(
        tree_map(
            lambda w: (w if w.ndim > 1 else w + 0.1 * mx.random.normal(w.shape)).astype(mx.bfloat16).astype(mx.float32),
            module.parameters(),
        )
    )
    weights = hf_layout(dict(tree_flatten(target.parameters())), "", config)
    weights.update(nextn_layout(module, config))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    loaded, _, _ = load_model(str(folder))  # mlx-lm drops the nextn layer and loads the target as made
    assert all(
        mx.array_equal(a, b).item()
        for (_, a), (_, b) in zip(tree_flatten(target.parameters()), tree_flatten(loaded.parameters()))
    )
    return folder


@pytest.fixture(scope="module", params=sorted(OWN))
def checkpoint(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("nextn") / request.param, request.param)


class PairOut(nn.Module):
    """An attention that answers (output, None), as GLM-5's does in the layer mlx-vlm's GLM nextn module runs."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def __call__(self, x, mask, cache):
        return self.attn(x, mask, cache[0]), None


def reference(folder, target):
    """mlx-vlm's GLM-5 nextn drafter (`glm_moe_dsa_mtp`: enorm, hnorm, eh_proj, a decoder layer, shared_head.norm;
    the driver feeds its output back) with mlx-vlm's own decoder layer of the checkpoint's family in place of
    GLM-5's, loaded with what mlx-vlm's GLM-4.7-Flash splitter takes from the checkpoint (mlx-vlm 0.7.10 ships that
    splitter without a runtime model; its embed_tokens and lm_head are the layer's own where it ships them)."""
    from mlx_vlm.speculative.drafters.glm4_moe_lite_mtp.split import Glm4MoeLiteMTPSplitter
    from mlx_vlm.speculative.drafters.glm_moe_dsa_mtp import Model
    from mlx_vlm.speculative.drafters.glm_moe_dsa_mtp.glm_moe_dsa_mtp import GlmMoeDsaMTP

    c = json.loads((folder / "config.json").read_text())
    kind, d = c["model_type"], c["hidden_size"]
    cfg = importlib.import_module(f"mlx_vlm.models.{kind}").ModelConfig.from_dict(c)
    layer = getattr(importlib.import_module(f"mlx_vlm.models.{kind}.language"), DECODERS[kind])(
        cfg, c["num_hidden_layers"]
    )
    module = GlmMoeDsaMTP.__new__(GlmMoeDsaMTP)  # its own __init__ builds GLM-5's attention
    nn.Module.__init__(module)
    module.enorm, module.hnorm, module.shared_head_norm = (nn.RMSNorm(d, eps=c["rms_norm_eps"]) for _ in range(3))
    module.eh_proj = nn.Linear(2 * d, d, bias=False)
    module.input_layernorm, module.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
    module.self_attn, module.mlp = PairOut(layer.self_attn), layer.mlp
    _, flat = Glm4MoeLiteMTPSplitter().prepare(folder)
    flat = {k: v.astype(mx.float32) for k, v in flat.items()}
    module.load_weights(
        [
            (
                k.replace("model.mtp_block.self_attn.", "self_attn.attn.")
                .replace("model.mtp_block.", "")
                .replace("model.", ""),
                v,
            )
            for k, v in flat.items()
            if k not in ("lm_head.weight", "model.embed_tokens.weight")
        ],
        strict=True,
    )
    ref = Model.__new__(Model)
    nn.Module.__init__(ref)
    ref.mtp = module
    ref.reset(target)  # binds the target's embedding and output layer, makes its cache
    if "lm_head.weight" in flat:
        ref._lm_head_fn = lambda h: h @ flat["lm_head.weight"].T
    if "model.embed_tokens.weight" in flat:
        ref._input_embed = lambda t: flat["model.embed_tokens.weight"][t]
    return ref


def test_the_module_agrees_with_mlx_vlms_glm_nextn_drafter_on_the_checkpoints_weights(checkpoint):
    target, _, _ = load_model(str(checkpoint))
    assert not any(f"layers.{len(target.layers)}." in k for k, _ in tree_flatten(target.parameters()))
    mine = mtp.load(checkpoint, target)
    assert ("head" in mine) == ("embed_tokens" in mine) == OWN[target.args.model_type]
    assert compare(mine, reference(checkpoint, target), target)


def broken_call(joined, fed_back_normed=True):
    """An `MTP.__call__` whose input is `joined(self, embedding, hidden)`; its output before the last norm where
    `fed_back_normed` is False (then `logits` norms it: vLLM's way of feeding back)."""

    def call(self, tokens, hidden, cache=None):
        h = self.fc(joined(self, self.embed(tokens), hidden))
        h = self.layers[0](h, create_attention_mask(h, cache[0], return_array=self.array_mask), cache[0])
        return self.norm(h) if fed_back_normed else h

    return call


BROKEN = {
    "inputs_swapped": broken_call(
        lambda s, e, h: mx.concatenate([s.pre_fc_norm_hidden(h), s.pre_fc_norm_embedding(e)], -1)
    ),
    "hidden_not_normed": broken_call(lambda s, e, h: mx.concatenate([s.pre_fc_norm_embedding(e), h], -1)),
    "fed_back_before_norm": broken_call(
        lambda s, e, h: mx.concatenate([s.pre_fc_norm_embedding(e), s.pre_fc_norm_hidden(h)], -1), False
    ),
}


@pytest.mark.parametrize("broken", [*BROKEN, "target_state_before_norm"])
def test_a_misplaced_input_norm_or_fed_back_state_fails_the_same_comparison(checkpoint, monkeypatch, broken):
    target, _, _ = load_model(str(checkpoint))
    mine = mtp.load(checkpoint, target)
    if broken in BROKEN:
        monkeypatch.setattr(mtp.MTP, "__call__", BROKEN[broken])
        if broken == "fed_back_before_norm":
            monkeypatch.setattr(mtp.MTP, "logits", lambda self, h: self.head(self.norm(h)))
    else:
        object.__setattr__(mine, "target_norm", lambda x: x)
    assert not compare(mine, reference(checkpoint, target), target)


@pytest.mark.parametrize("checkpoint", [a for a in sorted(OWN) if OWN[a]], indirect=True)
@pytest.mark.parametrize("broken", ["embed", "head"])
def test_where_the_layer_ships_its_own_embedding_and_head_reading_the_targets_fails_it(checkpoint, broken):
    target, _, _ = load_model(str(checkpoint))
    mine = mtp.load(checkpoint, target)
    object.__setattr__(mine, broken, target.model.embed_tokens if broken == "embed" else target.lm_head)
    assert not compare(mine, reference(checkpoint, target), target)


def test_mtp_drafts_equal_plain_greedy_and_other_families_are_refused_in_one_line(checkpoint, tmp_path):
    target, tok, _ = load_model(str(checkpoint))
    for prompt in (tok.encode("def add(a, b):\n    return a + b\n"), [2, 2, 1, 0, 2, 2, 1]):
        toks, stats = spec(target, prompt, make_drafter("mtp", target, tok), max_tokens=16, num_draft=3, adaptive=False)
        assert toks == plain_greedy(target, prompt, 16) and stats.proposed > 0
    other, other_tok, _ = load_model(str(make_model(tmp_path / "qwen2", "qwen2")))
    with pytest.raises(MlxSpecError) as e:
        make_drafter(f"mtp:{checkpoint}", other, other_tok)
    assert all(f in str(e.value) for f in mtp.FAMILIES) and "\n" not in str(e.value)


def test_rows_drafting_with_the_layer_in_one_pass_equal_plain_greedy(checkpoint):
    from test_eagle3 import rows_with_heads, run_rows

    target, tok, _ = load_model(str(checkpoint))
    prompts, maxes = [tok.encode("def add(a, b):\n"), [2, 2, 1, 0, 2, 2, 1], tok.encode("class Point:\n")], [14, 9, 20]
    e, rows = rows_with_heads(
        target, prompts, [make_drafter("mtp", target, tok), None, make_drafter("mtp", target, tok)], maxes
    )
    outs = run_rows(e)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    assert rows[0].stats.drafted_together >= 2


@pytest.mark.slow  # starts the CLI
def test_convert_keeps_the_nextn_layer_beside_the_model_and_mtp_runs_it_from_there(checkpoint, tmp_path):
    res = run_cli("convert", str(checkpoint), str(tmp_path / "mlx"), "--dtype", "float32")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "mlx"
    assert (out / mtp.FILE).is_file() and mtp.has_mtp(out) and mtp.has_mtp(checkpoint)
    target, tok, _ = load_model(str(out))
    original, _, _ = load_model(str(checkpoint))
    mine, theirs = make_drafter("mtp", target, tok).model, mtp.load(checkpoint, original)
    assert sorted(k for k, _ in tree_flatten(mine.parameters())) == sorted(
        k for k, _ in tree_flatten(theirs.parameters())
    )
    assert all(
        mx.array_equal(a, b).item()
        for (_, a), (_, b) in zip(tree_flatten(mine.parameters()), tree_flatten(theirs.parameters()))
    )
