"""Formats that interoperate: transformers 5's `rope_parameters` are read as the top-level keys are (a converted or
loaded target, a DFlash drafter, an EAGLE-3 head's layer), rotary settings mlx-lm cannot run are refused in one line,
and a head that does not fit names every weight that does not. Against the references themselves (the slow group,
skipped where PyTorch, transformers' models or speculators are absent): a Llama checkpoint written by transformers
converts to its greedy tokens; a train-head head loads in speculators and drafts its tokens there; heads that
speculators writes, with a Llama or a Qwen3 layer, match its network."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_model, make_tokenizer
from mlx.utils import tree_flatten
from test_dflash import BLOCK, qwen3_target, write_drafter

from mlx_spec.errors import SourceError, UnsupportedError
from mlx_spec.gen.cache import new_cache
from mlx_spec.gen.hidden import taps
from mlx_spec.gen.load import load_folder
from mlx_spec.make.convert import Options, convert_folder
from mlx_spec.models import dflash, eagle3, layer_config
from mlx_spec.models.rope import normalize

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
THETA = 500000.0


def top_level(config: dict) -> dict:
    """`config` with its flat rope_parameters moved to the top-level keys (the layout before transformers 5)."""
    c = dict(config)
    params = dict(c.pop("rope_parameters"))
    c["rope_theta"] = params.pop("rope_theta")
    if params.get("rope_type", "default") != "default":
        c["rope_scaling"] = params
    return c


def relaid(folder, dst, layout):
    """A copy of model folder `folder` whose config.json is rewritten by `layout`."""
    shutil.copytree(folder, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(layout(config)))
    return dst


def nested(config: dict) -> dict:
    """`config` with its rotary settings in transformers 5's rope_parameters only."""
    c = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling")}
    params = dict(config.get("rope_scaling") or {"rope_type": "default"})
    params["rope_type"] = params.pop("type", None) or params["rope_type"]
    return dict(c, rope_parameters=dict(params, rope_theta=config["rope_theta"]))


def ints(a) -> list:
    return np.array(a).tolist()


@pytest.mark.parametrize(
    "config, named",
    [
        (
            {"model_type": "llama", "rope_theta": 10000.0, "rope_parameters": dict(LLAMA3, rope_theta=THETA)},
            "rope_parameters.rope_theta=500000.0",
        ),
        (
            {
                "model_type": "llama",
                "rope_scaling": {"type": "linear", "factor": 2.0},
                "rope_parameters": dict(LLAMA3, rope_theta=THETA),
            },
            "rope_parameters.rope_type='llama3'",
        ),
        (
            {"model_type": "llama", "rope_parameters": {"rope_type": "wavelet", "rope_theta": THETA}},
            "rope_parameters.rope_type='wavelet'",
        ),
        (
            {"model_type": "gemma2", "rope_parameters": dict(LLAMA3, rope_theta=THETA)},
            "rope_parameters.rope_type='llama3'",
        ),
        ({"model_type": "llama", "rope_scaling": {"type": "wavelet"}}, "rope_scaling.type='wavelet'"),
        (
            {"model_type": "llama", "rope_parameters": {"full_attention": {"rope_theta": THETA}}},
            "rope_parameters: settings per layer type (full_attention)",
        ),
    ],
)
def test_rotary_settings_mlx_lm_cannot_run_are_refused_in_one_line_naming_the_key_and_value(config, named):
    with pytest.raises(UnsupportedError) as e:
        normalize(config)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_folder_with_rope_parameters_loads_as_with_the_top_level_keys_and_a_bad_one_converts_to_nothing(tmp_path):
    """mlx-lm's Llama reads only the top-level keys: loaded by mlx-lm alone, the same weights with rope_parameters
    give other logits (what the load would be without them folded)."""
    from mlx_lm.utils import load as mlx_load

    src = make_model(tmp_path / "llama", "llama", seed=5, scale=4.0)
    scaled = dict(json.loads((src / "config.json").read_text()), rope_theta=THETA, rope_scaling=LLAMA3)
    old = relaid(src, tmp_path / "old", lambda c: dict(c, rope_theta=THETA, rope_scaling=LLAMA3))
    new = relaid(src, tmp_path / "new", lambda c: nested(scaled))
    tokens = mx.array([list(range(3, 40))])
    logits = {f.name: load_folder(f)[0](tokens) for f in (old, new)}
    assert mx.allclose(logits["old"], logits["new"], rtol=0, atol=0).item()
    assert not mx.allclose(mlx_load(str(new))[0](tokens), logits["old"], atol=1e-3).item()

    bad = relaid(src, tmp_path / "bad", lambda c: dict(c, rope_parameters={"rope_type": "wavelet"}))
    with pytest.raises(UnsupportedError, match="rope_parameters.rope_type='wavelet'"):
        convert_folder(bad, tmp_path / "out", source="bad", source_sha256="")
    assert not (tmp_path / "out").exists()


def test_a_dflash_drafter_with_only_rope_parameters_drafts_as_with_the_top_level_keys(tmp_path):
    target = qwen3_target()
    reads = (0, 2, 3)
    old = write_drafter(
        tmp_path / "old", target, reads, rope_theta=THETA, rope_scaling={"type": "linear", "factor": 4.0}
    )
    new = relaid(old, tmp_path / "new", nested)
    assert "rope_theta" not in json.loads((new / "config.json").read_text())
    mx.random.seed(7)
    tokens = mx.random.randint(0, 64, (1, 24))
    _, states = taps(target, reads)(tokens, new_cache(target))
    blocks = {}
    for f in (old, new):
        module = dflash.load(f, target)
        cache = module.make_cache()
        module.context(states[:, :20], cache)
        block = mx.array([[tokens[0, 20].item()] + [module.config.mask_token_id] * (BLOCK - 1)])
        blocks[f.name] = module.logits(module.block(block, cache))
    assert mx.allclose(blocks["old"], blocks["new"], rtol=0, atol=0).item()
    assert ints(blocks["old"].argmax(-1)) == ints(blocks["new"].argmax(-1))


def test_a_head_whose_weights_do_not_fit_is_refused_naming_every_one_that_does_not(tmp_path, tiny_target):
    from test_eagle3 import random_head

    from mlx_spec.make import heads

    target, _ = tiny_target
    heads.save(random_head(0, target.args.vocab_size, 64, target.args.hidden_size, [1, 2, 3]), tmp_path / "head")
    weights = dict(mx.load(str(tmp_path / "head" / eagle3.FILE)))
    drop = [k for k in weights if k.startswith("layers.0.mlp.")]
    for k in drop:
        weights.pop(k)
    weights["layers.0.extra_a.weight"] = weights["layers.0.extra_b.weight"] = mx.zeros((2,))
    weights["norm.weight"] = mx.zeros((7,))
    mx.save_safetensors(str(tmp_path / "head" / eagle3.FILE), weights)
    with pytest.raises(SourceError) as e:
        eagle3.load(tmp_path / "head", embed=target.model.embed_tokens)
    message = str(e.value)
    assert "\n" not in message and len(drop) == 3
    for name in [*drop, "layers.0.extra_a.weight", "layers.0.extra_b.weight", "norm.weight (7,)"]:
        assert name in message, name


ERF_GELU = ("gelu", "gelu_python")  # transformers' ACT2FN names of the exact GELU
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast", "gelu_accurate")  # its approximation


def test_each_gelu_name_is_the_variant_transformers_means_by_it():
    """The exact GELU x Phi(x) (by erf) and its tanh approximation differ by up to ~5e-4: each name computes its own."""
    from math import erf, pi, sqrt

    x = np.linspace(-5, 5, 201, dtype=np.float32)
    exact = np.array([v * (1 + erf(v / sqrt(2))) / 2 for v in x])
    tanh = 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    quick = x / (1 + np.exp(-1.702 * x))
    assert np.abs(exact - tanh).max() > 1e-4  # far enough apart for the check below to tell them apart
    for names, want in ((ERF_GELU, exact), (TANH_GELU, tanh), (("quick_gelu",), quick)):
        for name in names:
            assert np.abs(np.array(layer_config.ACTS[name](mx.array(x))) - want).max() <= 2e-6, name


def with_layer(folder, dst, **fields):
    """A copy of drafter `folder` whose layer config (speculators' `transformer_layer_config`, else the config
    itself) has `fields` set."""

    def layout(c):
        if "transformer_layer_config" in c:
            return dict(c, transformer_layer_config=dict(c["transformer_layer_config"], **fields))
        return dict(c, **fields)

    return relaid(folder, dst, layout)


def drafter_logits(kind: str, folder, target) -> mx.array:
    """The first draft's logits of a drafter of `kind` in `folder` over `target`, fed its states on random tokens."""
    mx.random.seed(7)
    tokens = mx.random.randint(0, 64, (1, 24))
    if kind == "eagle3":
        head = eagle3.load(folder, embed=target.model.embed_tokens)
        _, states = taps(target, head.config.reads)(tokens, new_cache(target))
        return head.logits(head(tokens, states))
    module = dflash.load(folder, target)
    _, states = taps(target, module.config.reads)(tokens, new_cache(target))
    cache = module.make_cache()
    module.context(states[:, :20], cache)
    return module.logits(module.block(mx.array([[tokens[0, 20].item()] + [module.config.mask_token_id] * 3]), cache))


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_hidden_act_changes_what_a_drafter_computes_and_what_does_not_run_is_refused_in_one_line(tmp_path, kind):
    """The same weights with hidden_act silu, gelu and gelu_pytorch_tanh give three different drafts' logits (the
    interop tests below say which are right); an unknown activation or sliding-window layers are refused naming the
    field."""
    from test_eagle3 import random_head

    from mlx_spec.make import heads

    target = qwen3_target()
    if kind == "eagle3":
        silu = tmp_path / "silu"
        heads.save(random_head(0, 64, 64, target.args.hidden_size, [1, 2, 3], scale=4.0), silu)
        assert json.loads((silu / "config.json").read_text())["transformer_layer_config"]["hidden_act"] == "silu"
    else:
        silu = write_drafter(tmp_path / "silu", target, (0, 2, 3), scale=4.0, hidden_act="silu")
    logits = {
        act: drafter_logits(kind, with_layer(silu, tmp_path / act, hidden_act=act), target)
        for act in ("gelu", "gelu_pytorch_tanh")
    }
    logits["silu"] = drafter_logits(kind, silu, target)
    assert not mx.allclose(logits["silu"], logits["gelu"], atol=1e-3).item()
    assert not mx.array_equal(logits["gelu"], logits["gelu_pytorch_tanh"]).item()
    for name, fields, named in (
        ("xielu", {"hidden_act": "xielu"}, "hidden_act='xielu'"),
        ("sliding", {"layer_types": ["sliding_attention"] * 2}, "['sliding_attention'] layers"),
        ("qwen3_window", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, "sliding"),
    ):
        folder = with_layer(silu, tmp_path / name, **fields)
        with pytest.raises(UnsupportedError) as e:
            drafter_logits(kind, folder, target)
        assert named in str(e.value) and "\n" not in str(e.value), name


# ---------------------------------------------------------------------------------------------------------------------
# Against the references (PyTorch, transformers' models, speculators): the slow group


def torch_or_skip():
    torch = pytest.importorskip("torch", reason="the references need PyTorch (bash setup.sh --refs)")
    return torch


@pytest.mark.slow
def test_every_activation_name_computes_what_transformers_act2fn_computes_for_it():
    torch = torch_or_skip()
    from transformers.activations import ACT2FN

    x = np.linspace(-6, 6, 241, dtype=np.float32)
    for name, act in layer_config.ACTS.items():
        theirs = ACT2FN[name](torch.tensor(x)).numpy()
        assert np.abs(np.array(act(mx.array(x))) - theirs).max() <= 1e-5 * max(1.0, np.abs(theirs).max()), name


def llama_checkpoint(folder, layout):
    """A tiny random Llama written by transformers' own LlamaForCausalLM (theta 500000, llama3 scaling, in
    transformers 5's rope_parameters), its config relaid by `layout`; the transformers model."""
    torch = torch_or_skip()
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters=dict(LLAMA3, rope_theta=THETA),
        initializer_range=0.2,  # peaked distributions: a greedy token far from a tie
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(str(folder))
    written = json.loads((folder / "config.json").read_text())
    assert "rope_parameters" in written and "rope_theta" not in written  # what transformers 5 writes
    (folder / "config.json").write_text(json.dumps(layout(written)))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("layout", [lambda c: c, top_level], ids=["rope_parameters", "top_level"])
def test_a_llama_checkpoint_written_by_transformers_converts_to_its_greedy_tokens(tmp_path, layout):
    torch = torch_or_skip()
    from mlx_lm.models.cache import make_prompt_cache

    reference = llama_checkpoint(tmp_path / "hf", layout)
    out = convert_folder(tmp_path / "hf", tmp_path / "mlx", Options(dtype="float32"), source="hf", source_sha256="")
    model, _, _ = load_folder(out)
    prompt = list(range(3, 99))  # past original_max_position_embeddings: the scaled frequencies matter
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0].numpy()
        generated = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
    ours = np.array(model(mx.array([prompt]))[0])
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, np.abs(theirs).max())
    tokens, cache = list(prompt), make_prompt_cache(model)
    step = mx.array([tokens])
    for _ in range(24):
        token = model(step, cache=cache)[0, -1].argmax().item()
        tokens.append(token)
        step = mx.array([[token]])
    assert tokens[len(prompt) : len(prompt) + len(generated)] == generated.tolist()  # (up to its EOS, if one came)


def speculators_or_skip():
    torch_or_skip()
    return pytest.importorskip("speculators.models.eagle3.core", reason="speculators is not installed (--refs)")


def speculators_logits(model, tokens, states) -> np.ndarray:
    """speculators' first-step draft logits (its forward returns the tokens: the output layer's are read) of a head
    fed `tokens` and the target's `states`, with eager attention."""
    import torch

    seen = {}
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.setdefault("logits", out))
    with torch.no_grad():
        drafts = model(
            hidden_states=torch.tensor(np.array(states)),
            input_ids=torch.tensor(np.array(tokens)).long(),
            document_ids=torch.zeros(tokens.shape, dtype=torch.long),
            ttt_steps=1,
        )
    hook.remove()
    assert drafts[0].tolist() == seen["logits"].argmax(-1).tolist()
    return seen["logits"].numpy()


def agree(ours: mx.array, theirs: np.ndarray) -> None:
    ours = np.array(ours)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, np.abs(theirs).max())


@pytest.mark.slow
def test_a_head_from_train_head_loads_in_speculators_and_drafts_the_same_tokens_there(tmp_path):
    from conftest import CORPUS

    torch = torch_or_skip()
    core = speculators_or_skip()
    from speculators import SpeculatorModelConfig

    from mlx_spec.train import data as td
    from mlx_spec.train.head import TrainingPlan, train

    target, tok, folder = load_folder(make_model(tmp_path / "qwen2", "qwen2", seed=0, scale=4.0))
    out = tmp_path / "head"
    train(
        target,
        TrainingPlan("tiny", [1, 2, 3], 96, 48, minutes=5, lr=3e-3, warmup=1, max_steps=3),
        out,
        td.sequences(tok, CORPUS * 10, 48),
    )
    written = json.loads((out / "config.json").read_text())["speculators_config"]
    assert written["proposal_methods"][0]["speculative_tokens"] >= 1  # what vLLM's validation requires
    assert written["verifier"] == {"name_or_path": str(folder), "architectures": ["Qwen2ForCausalLM"]}
    assert mx.load(str(out / eagle3.FILE))["t2d"].sum().item() == 96

    config = SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"  # (flex attention wants a compiler)
    theirs = core.Eagle3DraftModel.from_pretrained(str(out), config=config)
    # the target's embedding, which the head reads and does not ship (speculators' loader takes it from the verifier
    # where its own stays NaN; transformers 5.24 initializes it first)
    theirs.embed_tokens.weight.data = torch.tensor(np.array(target.model.embed_tokens.weight))
    assert torch.equal(theirs.t2d, torch.tensor(np.array(mx.load(str(out / eagle3.FILE))["t2d"])))
    head = eagle3.load(out, embed=target.model.embed_tokens)
    mx.random.seed(3)
    tokens = mx.random.randint(0, target.args.vocab_size, (1, 24))
    _, states = taps(target, head.config.reads)(tokens, new_cache(target))
    agree(head.logits(head(tokens, states)), speculators_logits(theirs, tokens, states))


LAYER_FIELDS = {  # layer-config fields that change the network (mlp_bias: Llama's MLP reads it, Qwen3's does not)
    "silu": {},
    "gelu": {"hidden_act": "gelu"},
    "gelu_pytorch_tanh": {"hidden_act": "gelu_pytorch_tanh"},
    "attention_bias": {"attention_bias": True},
    "mlp_bias": {"mlp_bias": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("fields", LAYER_FIELDS.values(), ids=LAYER_FIELDS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_head_speculators_writes_with_a_llama_or_qwen3_layer_loads_and_matches_its_network(tmp_path, arch, fields):
    """Random weights written by speculators' own classes (its `--draft-arch`; Qwen3's attention has q/k norms), the
    layer config as transformers 5 writes it (rope_parameters, the values that differ from the class's defaults),
    with each activation and bias its layer reads."""
    torch = torch_or_skip()
    core = speculators_or_skip()
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    vocab, draft, d = 128, 48, 64
    layer = AutoConfig.for_model(
        arch,
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters=dict(LLAMA3, rope_theta=THETA)
        if arch == "llama"
        else {"rope_type": "default", "rope_theta": THETA},
        **fields,
    )
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=draft,
        target_hidden_size=d,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=[]),
        ),
    )
    torch.manual_seed(0)
    theirs = core.Eagle3DraftModel(config).eval()
    ids = torch.sort(torch.randperm(vocab)[:draft]).values
    with torch.no_grad():
        for p in theirs.parameters():  # norms too, so that a misplaced one shows
            p.copy_(torch.randn_like(p) * (0.2 if p.ndim > 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    theirs.load_vocab_mappings(torch.zeros(vocab, dtype=torch.bool).index_fill(0, ids, True), ids - torch.arange(draft))
    theirs.save_pretrained(str(tmp_path / "head"))
    written = json.loads((tmp_path / "head" / "config.json").read_text())["transformer_layer_config"]
    assert "rope_parameters" in written and "rope_theta" not in written
    if arch == "qwen3":
        assert any(k.endswith("q_norm.weight") for k in mx.load(str(tmp_path / "head" / "model.safetensors")))

    head = eagle3.load(tmp_path / "head")
    assert head.config.layer["rope_theta"] == THETA
    assert ints(head.ids()) == ids.tolist()
    mx.random.seed(1)
    tokens = mx.random.randint(0, vocab, (1, 40))  # past original_max_position_embeddings
    states = mx.random.normal((1, 40, 3 * d))
    agree(head.logits(head(tokens, states)), speculators_logits(theirs, tokens, states))
    mine = dict(tree_flatten(head.parameters()))
    assert all(k in mine for k in ("layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight")) == (
        arch == "qwen3"
    )


@pytest.mark.slow
@pytest.mark.parametrize("fields", LAYER_FIELDS.values(), ids=LAYER_FIELDS)
@pytest.mark.parametrize("layout", [nested, lambda c: c], ids=["rope_parameters", "top_level"])
def test_a_dflash_drafter_drafts_the_blocks_of_the_dflash_packages_network_with_either_layout(tmp_path, layout, fields):
    """z-lab's network from the `dflash` package, on the same weights (the layer config as transformers 5 writes it,
    or as before; each activation and bias a Qwen3 layer reads): the block's states and its draft tokens agree."""
    torch = torch_or_skip()
    reference = pytest.importorskip("dflash.model", reason="dflash is not installed (--refs)")
    target = qwen3_target()
    reads = (0, 2, 3)
    scaling = {"type": "linear", "factor": 4.0}
    top = write_drafter(tmp_path / "top", target, reads, rope_theta=THETA, rope_scaling=scaling, **fields)
    folder = relaid(top, tmp_path / "drafter", layout)
    theirs, loading = reference.DFlashDraftModel.from_pretrained(str(folder), output_loading_info=True)
    theirs.eval()
    assert not any(loading.values()), loading  # every weight the reference has (a bias too) was written and read
    ours = dflash.load(folder, target)
    mx.random.seed(7)
    tokens = mx.random.randint(0, 64, (1, 24))
    _, states = taps(target, reads)(tokens, new_cache(target))
    block = mx.array([[tokens[0, 20].item()] + [ours.config.mask_token_id] * (BLOCK - 1)])
    cache = ours.make_cache()
    ours.context(states[:, :20], cache)
    mine = ours.block(block, cache)
    with torch.no_grad():
        other = theirs(
            position_ids=torch.arange(20 + BLOCK)[None],
            noise_embedding=torch.tensor(np.array(target.model.embed_tokens(block))),
            target_hidden=torch.tensor(np.array(states[:, :20])),
        ).numpy()
    assert np.abs(np.array(mine) - other).max() <= 1e-4 * max(1.0, np.abs(other).max())
    assert ints(ours.logits(mine).argmax(-1)) == ints(ours.logits(mx.array(other)).argmax(-1))
