"""DFlash block drafters: the network agrees with mlx-vlm's on the same weights in z-lab's layout (and a causal block
or a misplaced context does not); the states the engine shows are the target's at the drafter's target layers; every
draft the engine gets, alone, in a hybrid and for rows drafting together, is mlx-vlm's block on that context; outputs
equal plain decoding; sampled drafts keep the target's law; a folder that is not a drafter for this target is
refused in one line."""

import json

import mlx.core as mx
import pytest
from conftest import (
    N_TOKENS,
    PROMPT,
    REPEATING,
    SAMPLES,
    V,
    check,
    chi_square_pvalue_ok,
    close,
    exact_joint,
    plain_greedy,
    randomized,
    sample_pairs,
    served_like_plain,
    spec,
    tiny,
)
from mlx.utils import tree_flatten, tree_map
from test_eagle3 import Alternate, rows_with_heads, run_rows

from mlx_spec.errors import GenerationError, MlxSpecError, UnsupportedError
from mlx_spec.gen import registry, verify
from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.drafters import dflash as drafting
from mlx_spec.gen.drafters.dflash import DFlashDrafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.hidden import taps
from mlx_spec.gen.joint import JointCache
from mlx_spec.gen.load import vocab_width
from mlx_spec.gen.rows import Row
from mlx_spec.gen.sampling import GREEDY, Sampler
from mlx_spec.models import dflash

BLOCK = 4  # one known token and three masks: drafts of up to three tokens
VARIANTS = ("architectures", "layer_types", "final_logit_softcapping")  # config keys of DFlash variants


def config(target, reads, block=BLOCK, mask=None, layers=2, **over) -> dict:
    """A z-lab config.json (a Qwen3 config with `dflash_config`) for a drafter over `target`."""
    d, vocab = target.args.hidden_size, vocab_width(target)
    return dict(
        dict(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            hidden_size=d,
            intermediate_size=2 * d,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            max_position_embeddings=512,
            vocab_size=vocab,
            tie_word_embeddings=False,
            block_size=block,
            num_target_layers=len(target.layers),
            layer_types=["full_attention"] * layers,
            dflash_config={"mask_token_id": vocab - 1 if mask is None else mask, "target_layer_ids": list(reads)},
        ),
        **over,
    )


def write_drafter(folder, target, reads, seed=0, scale=1.0, **over):
    """A drafter of random weights (norms too, so that a misplaced norm shows) in z-lab's layout: config.json and
    model.safetensors, the embedding and output layer left to the target's."""
    c = config(target, reads, **over)
    mx.random.seed(seed)  # a variant that does not run here gets the weights of one that does
    runs = config(target, reads, **{k: v for k, v in over.items() if k not in VARIANTS})
    module = dflash.DFlash(dflash.DFlashConfig.from_dict(runs))
    module.update(
        tree_map(lambda w: w * scale if w.ndim > 1 else w + 0.2 * mx.random.normal(w.shape), module.parameters())
    )
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(module.parameters())))
    (folder / "config.json").write_text(json.dumps(c))
    return folder


def reference(folder, target):
    """mlx-vlm's DFlash drafter of `folder`, bound to the target's embedding and output layer."""
    from mlx_vlm.speculative.drafters.qwen3_dflash import Model, ModelConfig

    ref = Model(ModelConfig.from_dict(json.loads((folder / "config.json").read_text())))
    ref.load_weights(list(ref.sanitize(dict(mx.load(str(folder / "model.safetensors")))).items()), strict=True)
    return ref.bind(target)


def qwen3_target(vocab=64, layers=4):
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        max_position_embeddings=256,
        head_dim=16,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    )
    return randomized(qwen3.Model, args, 3, 2.0)


GOLDEN_READS = (0, 2, 3)


def rounds(mine: dflash.DFlash, ref, target) -> bool:
    """Both drafters fed the same target states and blocks over three rounds (a prompt's states, then those of the
    1, 3 and 2 positions a round kept): whether the block logits agree at every round."""
    mx.random.seed(7)
    tokens = mx.random.randint(0, vocab_width(target), (1, 16))
    _, states = taps(target, GOLDEN_READS)(tokens, new_cache(target))
    mask, ours_cache, theirs_cache, same = mine.config.mask_token_id, mine.make_cache(), ref.make_cache(), True
    for start, end in ((0, 9), (9, 10), (10, 13), (13, 15)):
        block = mx.array([[tokens[0, end].item()] + [mask] * (BLOCK - 1)])
        theirs = ref(block, states[:, start:end], theirs_cache)
        mine.context(states[:, start:end], ours_cache)
        ours = mine.logits(mine.block(block, ours_cache))
        for c in ours_cache:
            c.trim(BLOCK)
        same = same and close(ours, theirs)
    return same


def test_the_drafter_agrees_with_mlx_vlms_dflash_on_the_same_weights_in_z_labs_layout(tmp_path):
    target = qwen3_target()
    folder = write_drafter(tmp_path / "d", target, GOLDEN_READS)
    mine, ref = dflash.load(folder, target), reference(folder, target)
    assert ref.config.target_layer_ids == list(GOLDEN_READS) and mine.config.reads == list(GOLDEN_READS)
    assert rounds(mine, ref, target)


@pytest.mark.parametrize("broken", ["causal_block", "context_normed", "context_unrotated"])
def test_a_causal_block_or_a_misplaced_context_fails_the_same_comparison(tmp_path, monkeypatch, broken):
    target = qwen3_target()
    folder = write_drafter(tmp_path / "d", target, GOLDEN_READS)
    if broken == "causal_block":

        def block(self, tokens, cache, mask=None):
            h = self.embed(tokens)
            for layer, c in zip(self.layers, cache):
                h = layer(h, "causal", c)
            return self.norm(h)

        monkeypatch.setattr(dflash.DFlash, "block", block)
    else:

        def context(self, states, cache):
            h = self.hidden_norm(self.fc(states))
            B, S, _ = h.shape
            for layer, c in zip(self.layers, cache):
                a, x = layer.self_attn, layer.input_layernorm(h) if broken == "context_normed" else h
                keys = a.k_norm(a.k_proj(x).reshape(B, S, a.n_kv_heads, -1)).transpose(0, 2, 1, 3)
                values = a.v_proj(x).reshape(B, S, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
                c.update_and_fetch(keys if broken == "context_unrotated" else a.rope(keys, offset=c.offset), values)

        monkeypatch.setattr(dflash.DFlash, "context", context)
    assert not rounds(dflash.load(folder, target), reference(folder, target), target)


def test_a_quantized_drafter_loads_as_it_was_quantized(tmp_path):
    """A folder whose config carries `quantization` (as an MLX conversion writes it) loads into the same network."""
    import mlx.nn as nn

    target = qwen3_target()
    c = config(target, GOLDEN_READS, quantization={"group_size": 32, "bits": 8})
    module = dflash.DFlash(dflash.DFlashConfig.from_dict(c))
    nn.quantize(module, 32, 8)
    (tmp_path / "q").mkdir()
    mx.save_safetensors(str(tmp_path / "q" / "model.safetensors"), dict(tree_flatten(module.parameters())))
    (tmp_path / "q" / "config.json").write_text(json.dumps(c))
    loaded = dflash.load(tmp_path / "q", target)
    assert all(
        mx.array_equal(a, b).item()
        for (_, a), (_, b) in zip(tree_flatten(loaded.parameters()), tree_flatten(module.parameters()))
    )
    assert "fc.scales" in dict(tree_flatten(loaded.parameters()))


def test_a_folder_that_is_not_a_dflash_drafter_or_one_for_another_target_is_one_line_refused(tmp_path, tiny_target):
    target, tok = tiny_target
    n = len(target.layers)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    for bad in ("empty", "eagle"):
        if bad == "eagle":
            write_drafter(tmp_path / bad, target, (0, 1, 2))
            c = json.loads((tmp_path / bad / "config.json").read_text())
            del c["dflash_config"], c["architectures"]
            (tmp_path / bad / "config.json").write_text(json.dumps(c))
        with pytest.raises(MlxSpecError, match="not a DFlash drafter") as e:
            registry.build(f"dflash:{tmp_path / bad}", target, tok)
        assert "\n" not in str(e.value)
    for name, over in (
        ("sliding", dict(layer_types=["sliding_attention", "full_attention"])),
        ("dflash2", dict(architectures=["DFlash2DraftModel"])),
        ("softcap", dict(final_logit_softcapping=30.0)),
    ):
        write_drafter(tmp_path / name, target, (0, 1, 2), **over)
        with pytest.raises(UnsupportedError) as e:
            registry.build(f"dflash:{tmp_path / name}", target, tok)
        assert "\n" not in str(e.value)
    vocab = vocab_width(target)
    for name, folder in (
        ("hidden", write_drafter(tmp_path / "hidden", target, (0, 1, 2), hidden_size=32)),
        ("layers", write_drafter(tmp_path / "layers", target, (0, 1, 2), num_target_layers=n + 4)),
        ("deep", write_drafter(tmp_path / "deep", target, (0, 1, n), num_target_layers=None)),
        ("vocab", write_drafter(tmp_path / "vocab", target, (0, 1, 2), vocab_size=vocab + 64)),
        ("mask", write_drafter(tmp_path / "mask", target, (0, 1, 2), mask=vocab)),
    ):
        with pytest.raises(GenerationError, match="another target") as e:
            registry.build(f"dflash:{folder}", target, tok)
        assert "\n" not in str(e.value), name
    with pytest.raises(GenerationError, match="dflash:FOLDER"):
        registry.parse("dflash")


# ---- on the engine: a tiny target of three blocks, the drafter reading all three ----------------------------------

READS = (0, 1, 2)


@pytest.fixture(scope="module")
def target():
    return tiny(1, 3.0, layers=3)


@pytest.fixture(scope="module")
def folder(target, tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("dflash") / "d", target, READS, scale=2.5)  # varied drafts


class _Tok:
    """A tokenizer of V tokens (what the registry asks of one)."""

    def get_vocab(self):
        return {str(i): i for i in range(V)}


def drafter(target, folder):
    """A DFlash drafter over `target` as the registry builds it (one module a target, shared by every drafter)."""
    return registry.build(f"dflash:{folder}", target, _Tok())


def test_the_states_shown_are_the_targets_at_its_target_layer_ids(target, folder, monkeypatch):
    """Every state the engine shows (prefill, drafting rounds with rejections, queued plain steps; held as the rounds
    gave them or joined into one array) equals the target's own at the blocks `target_layer_ids` names."""
    monkeypatch.setattr("mlx_spec.gen.drafters.eagle3.HELD_CHUNKS", 1)
    accepted = 0
    for planner in (None, Alternate):
        d, got = drafter(target, folder), []
        assert d.reads == READS
        see = d.see
        d.see = lambda at, states, got=got, see=see: (got.append((at, states)), see(at, states))
        prompt = [1, 0, 3, 2, 1, 0]
        kw = dict(planner=planner()) if planner else dict(adaptive=False)
        toks, stats = spec(target, prompt, d, max_tokens=20, num_draft=3, **kw)
        assert toks == plain_greedy(target, prompt, 20) and stats.proposed > stats.accepted
        accepted += stats.accepted
        context = prompt + toks
        _, states = taps(target, READS)(mx.array(context)[None], new_cache(target))
        covered = set()
        for at, s in got:
            assert close(s, states[0, at : at + s.shape[0]]), at
            covered.update(range(at, at + s.shape[0]))
        assert covered == set(range(len(context) - 1))
    assert accepted > 0  # states of accepted drafts were shown too


@pytest.fixture
def proposals(monkeypatch):
    """Every non-empty greedy draft the drafting hands the engine, with the context it was proposed at."""
    seen = []
    propose = drafting.DFlashDrafting.propose

    def record(self, members, *args, **kwargs):
        out = propose(self, members, *args, **kwargs)
        seen.extend(
            (list(m.context), d.tokens)
            for m, d in zip(members, out)
            if len(d) and (m.sampler is None or m.sampler.temp == 0)
        )
        return out

    monkeypatch.setattr(drafting.DFlashDrafting, "propose", record)
    return seen


def are_references(target, folder, seen) -> bool:
    """Whether each draft is mlx-vlm's greedy block on its context (fresh, fed the target's states of all of it)."""
    ref, mask = reference(folder, target), json.loads((folder / "config.json").read_text())["dflash_config"]
    for context, tokens in seen:
        _, states = taps(target, READS)(mx.array(context[:-1])[None], new_cache(target))
        block = mx.array([[context[-1]] + [mask["mask_token_id"]] * (BLOCK - 1)])
        want = mx.argmax(ref(block, states, ref.make_cache())[0, 1:], -1).tolist()
        if tokens.tolist() != want[: tokens.size]:
            return False
    return True


def test_each_draft_alone_or_in_a_hybrid_is_mlx_vlms_block_and_the_output_plain_greedy(target, folder, proposals):
    """One drafter over three prompts in turn (what it holds past a shared prefix dropped), and hybrids."""
    alone = drafter(target, folder)
    for prompt in (PROMPT, REPEATING, [2, 2, 1, 0, 2, 2, 1]):
        want = plain_greedy(target, prompt, 16)
        toks, stats = spec(target, prompt, alone, max_tokens=16, num_draft=3, adaptive=False)
        assert toks == want and stats.proposed > stats.accepted > 0
        hybrid = HybridDrafter([SuffixDrafter()], drafter(target, folder))
        toks, stats = spec(target, prompt, hybrid, max_tokens=16, num_draft=3, adaptive=False)
        assert toks == want and any(t["source"] == "dflash" for t in stats.trace)
    assert len(proposals) > 10 and are_references(target, folder, proposals)


class KeepsBlock(JointCache):
    """The drafting's cache, rewound but for the block: its keys stay among the context's."""

    def rewind(self, drop):
        if set(drop) != {BLOCK}:
            super().rewind(drop)


@pytest.mark.parametrize("broken", ["states_shifted", "block_kept"])
def test_a_misaligned_context_fails_the_reference_check(target, folder, proposals, monkeypatch, broken):
    """The check above catches a drafter fed the states of the next positions, or one whose cache keeps a block."""
    if broken == "states_shifted":
        at = DFlashDrafter._at
        monkeypatch.setattr(DFlashDrafter, "_at", lambda self, start, n: at(self, start + 1, n))
    else:
        init = drafting.DFlashDrafting.__init__

        def keeps(self, part):
            init(self, part)
            self.rows = KeepsBlock()

        monkeypatch.setattr(drafting.DFlashDrafting, "__init__", keeps)
    toks, _ = spec(target, REPEATING, drafter(target, folder), max_tokens=16, num_draft=3, adaptive=False)
    assert toks == plain_greedy(target, REPEATING, 16)  # verification hides it from the output
    assert proposals and not are_references(target, folder, proposals)


def test_rows_drafting_together_in_one_pass_get_mlx_vlms_blocks_and_equal_their_solo_runs(target, folder, proposals):
    """Rows of different lengths in one pass (one a hybrid, one plain), catching up two states a round beside the
    others, rows leaving and a row joining in a free place: every draft is the reference's, every output plain
    decoding's."""
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1], REPEATING + [2, 1, 3]]
    drafters = [
        drafter(target, folder),
        HybridDrafter([SuffixDrafter()], drafter(target, folder)),
        None,
        drafter(target, folder),
    ]
    maxes = [6, 20, 9, 16]
    e, rows = rows_with_heads(target, prompts, drafters, maxes)
    e.chunk = 2  # a row catches up two states a round while the others draft
    outs = {}
    while len(e.rows) == len(rows):  # until a row leaves; then a row joins in its place
        live = e.rows
        for i, steps in e.round().items():
            outs.setdefault(id(live[i]), []).extend(s.token for s in steps)
        for r in [r for r in e.rows if r.done]:
            e.remove(r)
    late, d = [3, 1, 0, 2, 1], drafter(target, folder)
    cache = new_cache(target)
    prefill_cache(target, cache, late[:-1], None, d.parts)
    row = Row(list(late), d, GREEDY, 12, "length", frozenset(), 3)
    e.add(row, cache)
    for key, toks in run_rows(e).items():
        outs.setdefault(key, []).extend(toks)
    for r, p, m in zip(rows + [row], prompts + [late], maxes + [12]):
        assert outs[id(r)] == plain_greedy(target, p, m)
    assert rows[3].stats.drafted_together >= 2 and row.stats.proposed > 0
    assert are_references(target, folder, proposals)


@pytest.fixture(scope="module")
def spread():
    return tiny(2, 1.0, layers=3)  # spread distributions; the drafter (peaked) disagrees with them


@pytest.fixture(scope="module")
def peaked(spread, tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("dflash") / "peaked", spread, READS, seed=5, scale=4.0, mask=V - 1)


@pytest.mark.slow  # chi-square laws, 800 samples each (about a minute each on 2 cores)
@pytest.mark.parametrize("where,broken", [("beside", False), ("alone", False), ("alone", True), ("beside", True)])
def test_sampled_block_drafts_keep_the_targets_law_and_a_rule_that_resamples_from_the_target_fails(
    spread, peaked, where, broken, monkeypatch
):
    if broken:
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft's law
    kw = dict(temp=1.0)
    if where == "alone":
        ok, stat, crit = check(spread, drafter(spread, peaked), kw)
    else:  # row 0 sampled beside a greedy row, both drafted in one pass
        seen = []

        def one():
            e, rows = rows_with_heads(
                spread,
                [PROMPT, REPEATING],
                [drafter(spread, peaked), drafter(spread, peaked)],
                [N_TOKENS, 6],
                [Sampler(**kw), GREEDY],
            )
            toks = []
            while not rows[0].done:
                toks += [s.token for s in e.round()[0]]
            seen.append(len(rows[0].stats.proposed_by_position))
            return toks

        ok, stat, crit = chi_square_pvalue_ok(
            sample_pairs(one, SAMPLES), exact_joint(spread, Sampler(**kw).probs), SAMPLES
        )
        assert min(seen) == max(seen) == 2
    assert ok != broken, f"{'broken' if broken else 'exact'} rule, {where}: chi2 {stat:.1f} vs {crit:.1f}"


@pytest.mark.slow
def test_served_with_a_dflash_drafter_concurrent_clients_get_the_plain_replies(tmp_path, tiny_models, tiny_target):
    """`serve --draft dflash:FOLDER` (four requests at once share the module) and `generate --draft
    hybrid:dflash:FOLDER`: the replies of plain decoding."""
    target, _ = tiny_target
    folder = write_drafter(tmp_path / "d", target, (0, 2, 3), seed=2)
    served_like_plain(tiny_models["qwen2"], f"dflash:{folder}", f"hybrid:dflash:{folder}")
