"""EAGLE-3 heads: the network agrees with mlx-vlm's on the same weights in the published layout (and a misplaced norm
or input does not); a head made of the target's last block reproduces the target from the states the engine hands
it; outputs equal plain decoding, alone and beside other rows; sampled drafts keep the target's law."""

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
    sample_pairs,
    served_like_plain,
    spec,
    tiny,
)
from mlx.utils import tree_flatten, tree_map

from mlx_spec.errors import GenerationError, MlxSpecError
from mlx_spec.gen import registry, verify
from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.drafters.eagle3 import Eagle3Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.hidden import pick, taps
from mlx_spec.gen.planner import PLAIN, Planner
from mlx_spec.gen.rows import Row
from mlx_spec.gen.sampling import GREEDY, Sampler
from mlx_spec.make import heads
from mlx_spec.models import eagle3

LAYER = dict(
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=256,
)


def random_head(seed: int, vocab: int, draft_vocab: int, target_hidden: int, reads, scale=1.0, **config):
    """An EAGLE-3 head of random weights (a random draft->target map where the draft vocabulary is smaller)."""
    mx.random.seed(seed)
    c = eagle3.Eagle3Config(dict(LAYER, **config), vocab, draft_vocab, target_hidden, list(reads))
    head = eagle3.Eagle3Head(c)
    head.freeze(keys=["d2t"])
    head.update(tree_map(lambda w: w * scale, head.trainable_parameters()))
    if draft_vocab < vocab:
        ids = mx.sort(mx.random.permutation(vocab)[:draft_vocab]).astype(mx.int32)
        head.d2t = ids - mx.arange(draft_vocab, dtype=mx.int32)
    mx.eval(head.parameters())
    return head


def test_the_head_agrees_with_mlx_vlms_eagle3_on_the_same_weights_in_the_speculators_layout(tmp_path):
    """Both load one folder; fed the same tokens and target states (a prefill, then drafts fed their own state),
    the draft-vocabulary logits and the target ids of the greedy drafts agree."""
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel
    from mlx_vlm.speculative.drafters.eagle3 import ModelConfig as Eagle3Config

    heads.save(random_head(0, 64, 24, 48, [1, 3, 5], norm_before_residual=False), tmp_path / "head")
    mine = eagle3.load(tmp_path / "head")
    ref = Eagle3DraftModel(Eagle3Config.from_dict(json.loads((tmp_path / "head" / "config.json").read_text())))
    ref.load_weights(list(ref.sanitize(mx.load(str(tmp_path / "head" / eagle3.FILE))).items()), strict=True)
    assert ref.config.target_layer_ids == [2, 4, 6]  # the inputs of those blocks: the outputs of ours, 1 3 5
    mx.random.seed(7)
    tokens, states = mx.random.randint(0, 64, (1, 9)), mx.random.normal((1, 9, 3 * 48))
    ref.reset(None)
    theirs = ref._forward_tokens(tokens, states, mx.int32)
    cache = [c for c in new_cache(mine)]
    ours = mine(tokens, states, cache)
    assert close(mine.logits(ours), ref._logits(theirs))
    for _ in range(3):  # drafts: each fed beside the head's own last state
        tok_ref = ref._sample(ref._logits(theirs[:, -1:]), None, mx.int32, greedy=True)
        tok = mine.ids()[mx.argmax(mine.logits(ours[:, -1:]), -1)]
        assert tok.tolist() == tok_ref.tolist()
        theirs, ours = ref._forward_tokens(tok_ref, theirs[:, -1:], mx.int32), mine(tok, ours[:, -1:], cache)
        assert close(mine.logits(ours), ref._logits(theirs))


@pytest.mark.parametrize("broken", ["inputs_swapped", "hidden_not_normed", "residual_normed"])
def test_a_misplaced_input_or_norm_fails_the_same_comparison(tmp_path, monkeypatch, broken):
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel
    from mlx_vlm.speculative.drafters.eagle3 import ModelConfig as Eagle3Config

    heads.save(random_head(0, 64, 24, 48, [1, 3, 5]), tmp_path / "head")
    ref = Eagle3DraftModel(Eagle3Config.from_dict(json.loads((tmp_path / "head" / "config.json").read_text())))
    ref.load_weights(list(ref.sanitize(mx.load(str(tmp_path / "head" / eagle3.FILE))).items()), strict=True)

    def wrong(self, embeds, hidden, mask, cache):
        normed = self.hidden_norm(hidden)
        parts = {
            "inputs_swapped": [normed, self.input_layernorm(embeds)],
            "hidden_not_normed": [self.input_layernorm(embeds), hidden],
        }.get(broken, [self.input_layernorm(embeds), normed])
        h = (normed if broken == "residual_normed" else hidden) + self.self_attn(mx.concatenate(parts, -1), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))

    monkeypatch.setattr(eagle3.FirstLayer, "__call__", wrong)
    mine = eagle3.load(tmp_path / "head")
    mx.random.seed(7)
    tokens, states = mx.random.randint(0, 64, (1, 9)), mx.random.normal((1, 9, 3 * 48))
    ref.reset(None)
    theirs = ref._logits(ref._forward_tokens(tokens, states, mx.int32))
    assert not mx.allclose(mine.logits(mine(tokens, states)), theirs, atol=1e-4).item()


def test_the_safeailab_layout_loads_into_the_same_head(tmp_path):
    """`midlayer.*` weights and a Llama config with `draft_vocab_size` (SafeAILab/EAGLE, SpecForge): the same
    network; the target's embedding is used where the head ships none."""
    head = random_head(3, 64, 24, 48, [1, 3, 5])
    heads.save(head, tmp_path / "spec")
    weights = {
        k.replace("layers.0.", "midlayer."): v
        for k, v in mx.load(str(tmp_path / "spec" / eagle3.FILE)).items()
        if not k.startswith("embed_tokens")
    }
    (tmp_path / "safe").mkdir()
    mx.save_safetensors(str(tmp_path / "safe" / "model.safetensors"), dict(weights, t2d=mx.zeros((64,), mx.bool_)))
    (tmp_path / "safe" / "config.json").write_text(
        json.dumps(
            dict(
                LAYER,
                architectures=["LlamaForCausalLMEagle3"],
                num_hidden_layers=1,
                vocab_size=64,
                draft_vocab_size=24,
                target_hidden_size=48,
                eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 6]},
            )
        )
    )
    assert "embed_tokens" not in eagle3.load(tmp_path / "safe")  # to convert or save: the target's comes at load
    safe = eagle3.load(tmp_path / "safe", embed=head.embed_tokens)
    assert "embed_tokens" not in dict(tree_flatten(safe.parameters()))  # the target's, not the head's
    assert safe.config.reads == [1, 3, 5]
    mx.random.seed(1)
    tokens, states = mx.random.randint(0, 64, (1, 5)), mx.random.normal((1, 5, 3 * 48))
    assert close(safe.logits(safe(tokens, states)), head.logits(head(tokens, states)), 1e-5)


def test_a_folder_that_is_not_a_head_or_a_head_for_another_target_is_one_line_refused(tmp_path, tiny_target):
    target, tok = tiny_target
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(MlxSpecError) as e:
        registry.build(f"eagle3:{tmp_path / 'empty'}", target, tok)
    assert "\n" not in str(e.value)
    n, d = len(target.layers), target.args.hidden_size
    heads.save(random_head(0, target.args.vocab_size, 64, d + 8, [0, 1, 2]), tmp_path / "wide")
    with pytest.raises(GenerationError, match="another target"):
        registry.build(f"eagle3:{tmp_path / 'wide'}", target, tok)
    heads.save(random_head(0, target.args.vocab_size, 64, d, [0, 1, n]), tmp_path / "deep")
    with pytest.raises(GenerationError, match="another target"):
        registry.build(f"eagle3:{tmp_path / 'deep'}", target, tok)
    with pytest.raises(GenerationError, match="eagle3:FOLDER"):
        registry.parse("eagle3")


# ---- on the engine: a tiny target of three blocks, the head reading all three --------------------------------------

READS = (0, 1, 2)


@pytest.fixture(scope="module")
def target():
    return tiny(1, 3.0, layers=3)


HEADS = {}


def head_drafter(target, seed=5, scale=1.0, draft_vocab=V):
    """A drafter over a random head, one head per (seed, scale, draft vocabulary) as a server shares one."""
    key = (seed, scale, draft_vocab)
    if key not in HEADS:
        HEADS[key] = random_head(seed, V, draft_vocab, 32, READS, scale)
    return Eagle3Drafter(HEADS[key], READS, V)


def mirror(target) -> Eagle3Drafter:
    """A head made of the target's last block, reading that block's input (the output of block 1): its output at each
    position is the target's own last state there, so its logits are the target's."""
    c = eagle3.Eagle3Config(dict(LAYER), V, V, 32, [1, 1, 1])
    head = eagle3.Eagle3Head(c, embed=target.model.embed_tokens)
    last, d = target.model.layers[-1], 32
    pick = mx.concatenate([mx.zeros((d, 2 * d)), mx.eye(d)], axis=1)  # the third of the three states
    head.fc.weight = pick
    first = head.layers[0]
    for name in ("q_proj", "k_proj", "v_proj"):  # the embedding's half weighs nothing
        w = getattr(last.self_attn, name)
        lin = getattr(first.self_attn, name)
        lin.weight = mx.concatenate([mx.zeros_like(w.weight), w.weight], axis=1)
        lin.bias = w.bias
    first.self_attn.o_proj, first.self_attn.rope = last.self_attn.o_proj, last.self_attn.rope
    first.hidden_norm, first.mlp, first.post_attention_layernorm = (
        last.input_layernorm,
        last.mlp,
        last.post_attention_layernorm,
    )
    head.norm, head.lm_head.weight = target.model.norm, target.model.embed_tokens.weight
    return Eagle3Drafter(head, (1, 1, 1), V)


class Alternate(Planner):
    """Two plain rounds in three (a step queued ahead, then one read as queued), then a drafting round."""

    def __init__(self):
        super().__init__(adaptive=False)
        self.n = 0

    def plan(self, *args, **kwargs):
        self.n += 1
        return super().plan(*args, **kwargs) if self.n % 3 == 0 else PLAIN


@pytest.mark.parametrize("planner", [None, Alternate])
def test_the_states_a_head_is_handed_are_the_targets_at_the_positions_kept(target, planner, monkeypatch):
    """Every state the engine hands (prefill, drafting rounds with rejections, queued plain steps; held as the rounds
    gave them or joined into one array) equals the target's own at that position of the final output; a head made of
    the target's last block then reproduces the target."""
    if planner is not None:
        monkeypatch.setattr("mlx_spec.gen.drafters.eagle3.HELD_CHUNKS", 1)
    d, got = mirror(target), []
    see = d.see
    d.see = lambda at, states: (got.append((at, states)), see(at, states))
    prompt = [1, 0, 3, 2, 1, 0]
    kw = dict(planner=planner()) if planner else dict(adaptive=False)
    toks, stats = spec(target, prompt, d, max_tokens=12, num_draft=2, **kw)
    assert toks == plain_greedy(target, prompt, 12) and stats.proposed > stats.accepted  # some drafts rejected
    context = prompt + toks
    _, states = taps(target, (1,))(mx.array(context)[None], new_cache(target))
    states = states[0]
    covered = set()
    for at, s in got:
        assert close(s, pick(states[at : at + s.shape[0]], (1,), (1, 1, 1))), at
        covered.update(range(at, at + s.shape[0]))
    assert covered == set(range(len(context) - 1))  # every position the target's cache holds, once handed
    head = d.model
    out = head(mx.array(context[1:])[None], pick(states[None, :-1], (1,), (1, 1, 1)), new_cache(head))
    assert (
        mx.argmax(head.logits(out), -1)[0].tolist() == mx.argmax(target(mx.array(context)[None])[0, :-1], -1).tolist()
    )


def plain_alone_and_in_a_hybrid(target, make) -> None:
    """A drafter from `make()`, alone (drafting) and behind the suffix table, gives plain greedy's tokens on three
    prompts."""
    for prompt in (PROMPT, REPEATING, [2, 2, 1, 0, 2, 2, 1]):
        want = plain_greedy(target, prompt, 16)
        toks, stats = spec(target, prompt, make(), max_tokens=16, num_draft=3, adaptive=False)
        assert toks == want and stats.proposed > 0
        hybrid = HybridDrafter([SuffixDrafter()], make())
        assert spec(target, prompt, hybrid, max_tokens=16, num_draft=3, adaptive=False)[0] == want


def test_eagle3_drafts_equal_plain_greedy_alone_and_in_a_hybrid(target):
    plain_alone_and_in_a_hybrid(target, lambda: head_drafter(target))


def rows_with_heads(target, prompts, drafters, maxes, samplers=None):
    e, rows = Engine(target, Planner(adaptive=False)), []
    for i, (p, d, m) in enumerate(zip(prompts, drafters, maxes)):
        cache = new_cache(target)
        prefill_cache(target, cache, p[:-1], None, d.parts if d is not None else ())
        r = Row(list(p), d, samplers[i] if samplers else GREEDY, m, "length", frozenset(), 3)
        e.add(r, cache)
        rows.append(r)
    return e, rows


def run_rows(e) -> dict:
    """Run an engine's rows to their ends: each row's tokens, by id(row)."""
    outs = {}
    while e.rows:
        live = e.rows
        for i, steps in e.round().items():
            outs.setdefault(id(live[i]), []).extend(s.token for s in steps)
        for r in [r for r in e.rows if r.done]:
            e.remove(r)
    return outs


def test_rows_drafting_with_one_head_in_one_pass_equal_their_solo_runs(target):
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1], REPEATING + [2, 1, 3]]
    drafters = [
        head_drafter(target),
        HybridDrafter([SuffixDrafter()], head_drafter(target)),
        None,
        head_drafter(target),
    ]
    maxes = [14, 20, 9, 16]
    e, rows = rows_with_heads(target, prompts, drafters, maxes)
    outs = run_rows(e)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    assert rows[0].stats.proposed > 0 and rows[0].stats.drafted_together >= 2


@pytest.fixture(scope="module")
def spread():
    return tiny(2, 1.0, layers=3)  # spread distributions; the head (peaked, seed 5) disagrees with them


def beside(spread, kw):
    """Row 0's tokens sampled with the head beside a greedy row drafting with it too, and the positions verified."""
    seen = []

    def one():
        e, rows = rows_with_heads(
            spread,
            [PROMPT, REPEATING],
            [head_drafter(spread, scale=4.0), head_drafter(spread, scale=4.0)],
            [N_TOKENS, 6],
            [Sampler(**kw), GREEDY],
        )
        toks = []
        while not rows[0].done:
            toks += [s.token for s in e.round()[0]]
        seen.append(len(rows[0].stats.proposed_by_position))
        return toks

    return one, seen


@pytest.mark.slow  # chi-square laws, 800 samples each (about a minute each on 2 cores)
@pytest.mark.parametrize("where,broken", [("beside", False), ("alone", False), ("alone", True), ("beside", True)])
def test_sampled_head_drafts_keep_the_targets_law_and_a_rule_that_resamples_from_the_target_fails(
    spread, where, broken, monkeypatch
):
    if broken:
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft's law
    kw = dict(temp=1.0)
    n = SAMPLES // 2 if broken else SAMPLES  # the broken rule's chi-square on 400: 164 and 173 against 45
    if where == "alone":
        ok, stat, crit = check(spread, head_drafter(spread, scale=4.0), kw, n=n)
    else:
        fn, seen = beside(spread, kw)
        ok, stat, crit = chi_square_pvalue_ok(sample_pairs(fn, n), exact_joint(spread, Sampler(**kw).probs), n)
        assert min(seen) == max(seen) == 2
    assert ok != broken, f"{'broken' if broken else 'exact'} rule, {where}: chi2 {stat:.1f} vs {crit:.1f}"


@pytest.mark.slow  # runs the CLI
def test_convert_takes_a_head_into_mlx_quantized_and_the_drafter_runs_it(tmp_path, tiny_target):
    """`mlx-spec convert` of a SafeAILab-layout head (no embedding of its own): the speculators layout, 8-bit, its
    provenance kept; loaded over the target, its drafts keep the output equal to plain decoding."""
    from conftest import run_main

    target, tok = tiny_target
    d, vocab = target.args.hidden_size, target.args.vocab_size
    head = random_head(4, vocab, 64, d, [1, 2, 3], hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    heads.save(head, tmp_path / "spec")
    weights = {
        k.replace("layers.0.", "midlayer."): v
        for k, v in mx.load(str(tmp_path / "spec" / eagle3.FILE)).items()
        if not k.startswith("embed_tokens")
    }
    (tmp_path / "safe").mkdir()
    mx.save_safetensors(str(tmp_path / "safe" / "model.safetensors"), weights)
    (tmp_path / "safe" / "config.json").write_text(
        json.dumps(
            dict(
                LAYER,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                architectures=["LlamaForCausalLMEagle3"],
                num_hidden_layers=1,
                vocab_size=vocab,
                draft_vocab_size=64,
                target_hidden_size=d,
                eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 3, 4]},
            )
        )
    )
    res = run_main("convert", tmp_path / "safe", tmp_path / "mlx", "--quantize", "8", "--group-size", "32")
    assert res.returncode == 0, res.stderr
    config = json.loads((tmp_path / "mlx" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert config["transformer_layer_config"]["quantization"]["bits"] == 8
    assert config["mlx_spec"]["source"] == str(tmp_path / "safe")
    drafter = registry.build(f"eagle3:{tmp_path / 'mlx'}", target, tok)
    assert "fc.scales" in dict(tree_flatten(drafter.model.parameters()))  # quantized as saved
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    toks, stats = spec(target, prompt, drafter, max_tokens=24, num_draft=3, adaptive=False)
    assert toks == plain_greedy(target, prompt, 24) and stats.proposed > 0
    res = run_main("convert", tmp_path / "safe", tmp_path / "bad", "--keep-layers", "1")
    assert res.returncode != 0 and "EAGLE-3 head" in res.stderr and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_served_with_a_head_concurrent_clients_get_the_plain_replies_and_one_cli_generate_agrees(
    tmp_path, tiny_models, tiny_target
):
    """`serve --draft eagle3:HEAD` (four requests at once share the head) and `generate --draft hybrid:eagle3:HEAD`:
    the replies of plain decoding."""
    target, _ = tiny_target
    heads.save(random_head(2, target.args.vocab_size, 96, target.args.hidden_size, [1, 2, 3]), tmp_path / "head")
    served_like_plain(tiny_models["qwen2"], f"eagle3:{tmp_path / 'head'}", f"hybrid:eagle3:{tmp_path / 'head'}")


def test_without_a_drafter_that_reads_states_no_pass_keeps_any(target, monkeypatch):
    """Plain decoding and every other drafter run the plain target: the view that keeps states never runs."""
    from mlx_spec.gen import hidden
    from mlx_spec.gen.drafters.model import ModelDrafter

    def never(self, *a, **k):
        raise AssertionError("a pass kept the target's states with no drafter reading them")

    monkeypatch.setattr(hidden.Taps, "__call__", never)
    for drafter in (None, SuffixDrafter(), HybridDrafter([SuffixDrafter()], ModelDrafter(tiny(0, 1.5), V))):
        assert spec(target, REPEATING, drafter, max_tokens=8)[0] == plain_greedy(target, REPEATING, 8)
