"""A target's own MTP layers (Qwen3-Next's `mtp.*`): the module agrees with mlx-vlm's Qwen MTP drafter on the same
checkpoint weights (and a misplaced input or norm does not); an MTP module made of the target's last block reproduces
the target from the states the engine shows it; outputs equal plain decoding alone, in a hybrid and beside other rows;
sampled drafts keep the target's law."""

import json

import mlx.core as mx
import pytest
from conftest import (
    PROMPT,
    REPEATING,
    V,
    check,
    close,
    make_model,
    plain_greedy,
    randomized,
    served_like_plain,
    spec,
    tiny_config,
)
from mlx.utils import tree_flatten, tree_map
from test_eagle3 import plain_alone_and_in_a_hybrid, rows_with_heads, run_rows

from mlx_spec.errors import MlxSpecError, UnsupportedError
from mlx_spec.gen import registry, verify
from mlx_spec.gen.cache import new_cache
from mlx_spec.gen.drafters.mtp import MTPDrafter
from mlx_spec.gen.hidden import taps
from mlx_spec.gen.load import vocab_width
from mlx_spec.models import mtp
from mlx_spec.named import load_model, make_drafter


def next_model(seed: int, scale: float, vocab: int = V):
    from mlx_lm.models import qwen3_next

    return randomized(
        qwen3_next.Model, qwen3_next.ModelArgs.from_dict(tiny_config("qwen3_next", vocab, 4)), seed, scale
    )


def random_mtp(target, seed: int, scale: float = 1.0) -> mtp.MTP:
    mx.random.seed(seed)
    module = mtp.MTP(target)
    module.update(
        tree_map(lambda w: w * scale if w.ndim > 1 else w + 0.1 * mx.random.normal(w.shape), module.parameters())
    )
    mx.eval(module.parameters())
    return module


ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")  # MoE experts one array each; dense; MoE experts fused


def hf_layout(weights: dict, arch: str, prefix: str = "") -> dict:
    """MLX weights as the arch's published checkpoints store them: zero-centred norms, convolutions (out, 1, k),
    experts one array each (Qwen3-Next) or fused gate/up and stacked (Qwen3.5-MoE), Qwen3.5's text model under
    `model.language_model`; each key after `prefix`."""
    target_norms = (
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    )
    out = {}
    for k, v in weights.items():
        name = prefix + k.replace("language_model.model.", "model.language_model.", 1)
        if ".switch_mlp." in k and arch == "qwen3_next":
            base, proj = name.split(".switch_mlp.")
            for i in range(v.shape[0]):
                out[f"{base}.experts.{i}.{proj}"] = v[i]
        elif ".switch_mlp." in k:
            base, proj = name.split(".switch_mlp.")
            if proj == "down_proj.weight":
                out[f"{base}.experts.down_proj"] = v
            elif proj == "gate_proj.weight":
                out[f"{base}.experts.gate_up_proj"] = mx.concatenate(
                    [v, weights[k.replace("gate_proj", "up_proj")]], axis=-2
                )
        elif v.ndim == 1 and k.endswith(mtp.NORMS if prefix else target_norms):
            out[name] = v - 1.0
        else:
            out[name] = v.moveaxis(2, 1) if "conv1d.weight" in k else v
    return out


def moe_config(arch: str) -> dict:
    c = tiny_config("qwen3_next", 4, 4)  # for its MoE fields
    return (
        {
            k: c[k]
            for k in (
                "num_experts",
                "num_experts_per_tok",
                "shared_expert_intermediate_size",
                "moe_intermediate_size",
                "decoder_sparse_step",
            )
        }
        if arch == "qwen3_5_moe"
        else {}
    )


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    """A tiny checkpoint of the arch in the published layout whose weights carry random MTP layers."""
    arch = request.param
    folder = make_model(
        tmp_path_factory.mktemp("mtp") / arch, "qwen3_5" if arch == "qwen3_5_moe" else arch, seed=5, scale=4.0
    )
    if arch == "qwen3_5_moe":  # the dense tiny model's config with experts: the MoE model, made again
        config = dict(json.loads((folder / "config.json").read_text()), model_type=arch, **moe_config(arch))
        (folder / "config.json").write_text(json.dumps(config))
        from mlx_lm.models import qwen3_5_moe

        model = randomized(qwen3_5_moe.Model, qwen3_5_moe.ModelArgs.from_dict(config), 5, 4.0)
        mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    target, _, _ = load_model(str(folder))
    weights = hf_layout(dict(mx.load(str(folder / "model.safetensors"))), arch)
    weights.update(hf_layout(dict(tree_flatten(random_mtp(target, 3).parameters())), arch, "mtp."))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    again, _, _ = load_model(str(folder))
    assert all(
        mx.array_equal(a, b).item()
        for (_, a), (_, b) in zip(tree_flatten(target.parameters()), tree_flatten(again.parameters()))
    )
    return folder


def reference(folder, target):
    """mlx-vlm's Qwen3.5 MTP drafter (dense or MoE: Qwen3.5-MoE's layer is Qwen3-Next's) over the checkpoint's
    weights."""
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import Model, ModelConfig

    c = json.loads((folder / "config.json").read_text())
    moe = c["model_type"] != "qwen3_5"
    rotary = int(c["head_dim"] * (c.get("partial_rotary_factor") or c["rope_parameters"]["partial_rotary_factor"]))
    text = dict(
        c,
        model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
        mtp_num_hidden_layers=1,
        rope_parameters={
            "type": "default",
            "rope_theta": c.get("rope_theta", 10000.0),
            "mrope_section": [rotary // 2, 0, 0],
            "partial_rotary_factor": rotary / c["head_dim"],
        },
    )
    if c["model_type"] == "qwen3_next":
        text["norm_topk_prob"] = target.args.norm_topk_prob
    ref = Model(ModelConfig.from_dict({"model_type": "qwen3_5_mtp", "text_config": text}))
    raw = {k: v for k, v in mx.load(str(folder / "model.safetensors")).items() if k.startswith("mtp.")}
    ref.load_weights(list(ref.sanitize(raw).items()), strict=True)
    ref.reset(target)
    return ref


def compare(mine: mtp.MTP, ref, target, tol=1e-4) -> bool:
    """Both fed the same tokens beside the target's last states (a prefill), then three drafts each fed its own
    output: whether the logits agree at every step. Ours reads the last block's output through `target_norm`, as the
    drafter is shown it; mlx-vlm's reads the target's normed output, as its verifier hands it over."""
    mx.random.seed(7)
    tokens = mx.random.randint(0, vocab_width(target), (1, 10))
    _, last = taps(target, (len(target.layers) - 1,))(tokens, new_cache(target))
    x, theirs_h, ours_h = tokens[:, 1:], target.model(tokens)[:, :-1], mine.target_norm(last)[:, :-1]
    theirs, cache = ref._forward_tokens(x, theirs_h, mx.int32), new_cache(mine)
    ours = mine(x, ours_h, cache)
    same = close(mine.logits(ours), ref._lm_head_fn(theirs), tol)
    for _ in range(3):
        tok = mx.argmax(ref._lm_head_fn(theirs[:, -1:]), -1)
        theirs, ours = ref._forward_tokens(tok, theirs[:, -1:], mx.int32), mine(tok, ours[:, -1:], cache)
        same = same and close(mine.logits(ours), ref._lm_head_fn(theirs), tol)
    return same


def test_the_module_agrees_with_mlx_vlms_qwen_mtp_on_the_checkpoints_weights(checkpoint):
    target, _, _ = load_model(str(checkpoint))
    assert not any("mtp" in k for k, _ in tree_flatten(target.parameters()))  # mlx-lm dropped them
    mine = mtp.load(checkpoint, target)
    assert compare(mine, reference(checkpoint, target), target)


@pytest.mark.parametrize("broken", ["inputs_swapped", "norms_as_stored", "hidden_not_normed"])
def test_a_misplaced_input_or_norm_fails_the_same_comparison(checkpoint, monkeypatch, broken):
    target, _, _ = load_model(str(checkpoint))
    if broken == "norms_as_stored":
        monkeypatch.setattr(mtp, "NORMS", ("no-norm",))
    mine = mtp.load(checkpoint, target)
    if broken == "inputs_swapped":
        monkeypatch.setattr(
            mtp.MTP,
            "__call__",
            lambda self, t, h, cache=None: self.norm(
                self.layers[0](
                    self.fc(
                        mx.concatenate([self.pre_fc_norm_hidden(h), self.pre_fc_norm_embedding(self.embed(t))], -1)
                    ),
                    "causal" if t.shape[1] > 1 else None,
                    cache[0] if cache else None,
                )
            ),
        )
    if broken == "hidden_not_normed":
        monkeypatch.setattr(
            mtp.MTP,
            "__call__",
            lambda self, t, h, cache=None: self.norm(
                self.layers[0](
                    self.fc(mx.concatenate([self.pre_fc_norm_embedding(self.embed(t)), h], -1)),
                    "causal" if t.shape[1] > 1 else None,
                    cache[0] if cache else None,
                )
            ),
        )
    assert not compare(mine, reference(checkpoint, target), target)


def test_mtp_loads_from_the_targets_own_folder_and_refuses_one_line_where_there_is_none(checkpoint, tmp_path):
    target, tok, _ = load_model(str(checkpoint))
    d = make_drafter("mtp", target, tok)
    assert isinstance(d, MTPDrafter) and d is not make_drafter("mtp", target, tok)
    assert d.model is make_drafter(f"mtp:{checkpoint}", target, tok).model  # one module a target, every request's
    assert registry.default_num_draft("mtp") >= 1 and str(registry.parse("hybrid:mtp").inner) == "mtp"
    plain = make_model(tmp_path / "plain", "qwen3_next", seed=5)
    with pytest.raises(MlxSpecError) as e:
        make_drafter(f"mtp:{plain}", target, tok)
    assert "no MTP layers" in str(e.value) and "\n" not in str(e.value)
    other, other_tok, _ = load_model(str(make_model(tmp_path / "qwen2", "qwen2")))
    with pytest.raises(MlxSpecError) as e:
        make_drafter(f"mtp:{checkpoint}", other, other_tok)
    assert "the target is qwen2" in str(e.value) and "\n" not in str(e.value)


def test_mtp_layers_configured_with_another_activation_are_refused_in_one_line(checkpoint, tmp_path):
    """mlx-lm's layers of these families run SiLU whatever `hidden_act` says: another is refused, naming it."""
    import shutil

    target, _, _ = load_model(str(checkpoint))
    folder = shutil.copytree(checkpoint, tmp_path / "gelu")
    config = json.loads((folder / "config.json").read_text())
    (config.get("text_config") or config)["hidden_act"] = "gelu"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError) as e:
        mtp.load(folder, target)
    assert "hidden_act='gelu'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # runs the CLI
def test_convert_keeps_the_mtp_layers_beside_the_model_and_mtp_runs_them_from_there(checkpoint, tmp_path):
    """`mlx-spec convert` of a checkpoint with MTP layers: the module's weights in mtp.safetensors beside a folder
    mlx-lm still loads; `mtp` over the converted target is the same module; a layer-dropped draft keeps none."""
    from conftest import run_main

    res = run_main("convert", checkpoint, tmp_path / "mlx", "--dtype", "float32")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "mlx"
    config = json.loads((out / "config.json").read_text())
    assert (out / mtp.FILE).is_file() and "mtp_layers" in [o["op"] for o in config["mlx_spec"]["operations"]]
    target, tok, _ = load_model(str(out))
    original, _, _ = load_model(str(checkpoint))
    mine, theirs = make_drafter("mtp", target, tok).model, mtp.load(checkpoint, original)
    assert all(
        mx.array_equal(a, b).item()
        for (_, a), (_, b) in zip(tree_flatten(mine.parameters()), tree_flatten(theirs.parameters()))
    )
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    toks, stats = spec(target, prompt, make_drafter("mtp", target, tok), max_tokens=16, num_draft=3, adaptive=False)
    assert toks == plain_greedy(target, prompt, 16) and stats.proposed > 0
    res = run_main("convert", checkpoint, tmp_path / "draft", "--keep-layers", "2")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "draft" / mtp.FILE).exists()


@pytest.fixture(scope="module")
def target():
    return next_model(1, 3.0)


MODULES = {}


def drafter(target, seed=5, scale=1.0):
    key = (id(target), seed, scale)
    if key not in MODULES:
        MODULES[key] = random_mtp(target, seed, scale)
    return MTPDrafter(MODULES[key], len(target.layers), V)


def test_the_states_an_mtp_drafter_is_shown_are_the_targets_last_normed_states(target):
    d, got = drafter(target), []
    see = d.see
    d.see = lambda at, states: (got.append((at, d.model.target_norm(states))), see(at, states))
    prompt = [1, 0, 3, 2, 1, 0]
    toks, stats = spec(target, prompt, d, max_tokens=12, num_draft=2, adaptive=False)
    assert toks == plain_greedy(target, prompt, 12) and stats.proposed > 0
    context = prompt + toks
    want = target.model(mx.array(context)[None])[0]
    assert d.reads == (len(target.layers) - 1,)
    covered = set()
    for at, s in got:
        assert close(s, want[at : at + s.shape[0]]), at
        covered.update(range(at, at + s.shape[0]))
    assert covered == set(range(len(context) - 1))
    _, last = taps(target, d.reads)(mx.array(context)[None], new_cache(target))
    assert close(target.model.norm(last[0]), want)


def test_mtp_drafts_equal_plain_greedy_alone_in_a_hybrid_and_beside_other_rows(target):
    plain_alone_and_in_a_hybrid(target, lambda: drafter(target))
    prompts, maxes = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1]], [14, 20, 9]
    e, rows = rows_with_heads(target, prompts, [drafter(target), None, drafter(target)], maxes)
    outs = run_rows(e)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    assert rows[0].stats.drafted_together >= 2


@pytest.mark.slow  # a chi-square law over thousands of sampled rounds (about 30 s)
@pytest.mark.parametrize("broken", [False, True])
def test_sampled_mtp_drafts_keep_the_targets_law_and_a_rule_that_resamples_from_the_target_fails(broken, monkeypatch):
    spread = next_model(2, 1.0)
    if broken:
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)
    ok, stat, crit = check(spread, drafter(spread, scale=4.0), dict(temp=1.0))
    assert ok != broken, f"{'broken' if broken else 'exact'} rule: chi2 {stat:.1f} vs {crit:.1f}"


@pytest.mark.slow
def test_served_with_mtp_concurrent_clients_get_the_plain_replies_and_one_cli_generate_agrees(checkpoint):
    """`serve --draft mtp` (the target's own folder, four requests at once) and `generate --draft hybrid:mtp`: the
    replies of plain decoding."""
    served_like_plain(checkpoint, "mtp", "hybrid:mtp")
