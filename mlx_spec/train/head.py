"""`mlx-spec train-head`: an EAGLE-3 head for a target, trained in MLX with training-time test (the head fed its own
states for several steps, as the EAGLE-3 paper trains it), checkpointed, resumable, saved in the published layout."""

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import SourceError
from ..gen.load import folder_of
from ..make.progress import progress
from ..models import eagle3
from ..models.base import text_of
from ..models.drafter_weights import safetensors
from .data import TOP, Shards

STEPS = 3  # training-time test: each position drafts this many tokens, each step fed the head's own state
DECAY = 0.8  # a later step's loss weighs less (it is accepted only after the earlier ones)
HELD = 8  # the most sequences held out (a shard): enough for a curve, and the rest of a small text goes to training
OPTIMIZER = "optimizer.safetensors"  # AdamW's moments, beside the head, for --resume


@dataclass
class TrainingPlan:
    """What a training run is: its data, its head and its budget (kept in DIR/train.json, with what it did)."""

    target: str
    reads: list[int]
    draft_vocab: int
    length: int = 512
    minutes: float | None = 120.0  # the whole run's time (None: no clock; `max_steps` bounds it)
    data_share: float = 0.4  # of the minutes, at most this goes to the target's features
    lr: float = 3e-4
    warmup: int = 50  # steps of linearly growing learning rate, then a cosine down to a tenth by the budget's end
    batch: int = 2  # sequences a step (a step's time grows with it; more steps do more for a head than bigger ones)
    max_steps: int | None = None  # stop after this many steps, if the minutes have not run out before
    held: int | None = None  # sequences held out to measure acceptance on (`held_out`, fixed once the data is there)
    limit_gb: float = 4.0
    data: list[str] = field(default_factory=list)  # where the text came from
    done: dict = field(default_factory=dict)  # tokens, steps, seconds, curve: what the run did so far


def held_out(n: int) -> int:
    """Sequences of `n` held out to measure acceptance on: an eighth, 1 to `HELD`; none of a single sequence (the
    curve is then measured on the sequence trained on)."""
    return 0 if n < 2 else min(HELD, max(1, n // 8))


def initial_head(target, reads: Sequence[int], ids: mx.array) -> eagle3.Eagle3Head:
    """A head started from the target: its decoder layer the target's last block (the token's half of the attention
    inputs zero, fc passing the deepest state read), its norm and output rows the target's for the draft vocabulary
    `ids` (target ids, sorted)."""
    text = text_of(target)
    args, inner = text.args, text.body
    layer = {
        k: getattr(args, k)
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "rms_norm_eps",
            "rope_theta",
            "rope_scaling",
            "max_position_embeddings",
        )
        if getattr(args, k, None) is not None
    }
    bias = "bias" in inner.layers[-1].self_attn.q_proj  # (Qwen2's q/k/v have biases; the layout has one switch)
    config = eagle3.Eagle3Config(
        dict(layer, model_type="llama", attention_bias=bias),
        args.vocab_size,
        ids.size,
        args.hidden_size,
        list(reads),
        verifier=_verifier(target),
    )
    head = eagle3.Eagle3Head(config, embed=inner.embed_tokens)
    d, last, first = args.hidden_size, inner.layers[-1], head.layers[0]
    head.fc.weight = mx.concatenate([mx.zeros((d, 2 * d)), mx.eye(d)], axis=1)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        src, dst = getattr(last.self_attn, name), getattr(first.self_attn, name)
        w = _weight(src)
        dst.weight = mx.concatenate([mx.zeros_like(w), w], axis=1) if name != "o_proj" else w
        if "bias" in dst:
            dst.bias = src.bias if "bias" in src else mx.zeros_like(dst.bias)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(first.mlp, name).weight = _weight(getattr(last.mlp, name))
    first.post_attention_layernorm.weight = last.post_attention_layernorm.weight
    first.hidden_norm.weight = last.input_layernorm.weight
    head.norm.weight = inner.norm.weight
    head.lm_head.weight = _weight(text.head)[ids]
    head.d2t = ids.astype(mx.int32) - mx.arange(ids.size, dtype=mx.int32)
    head.freeze(keys=["d2t"])
    mx.eval(head.parameters())
    return head


def _verifier(target) -> dict:
    """speculators' record of the target a head drafts for: the folder it was loaded from, and its architectures."""
    folder = folder_of(target)
    if folder is None:
        return {}
    return {
        "name_or_path": str(folder),
        "architectures": json.loads((folder / "config.json").read_text()).get("architectures") or [],
    }


def _weight(layer) -> mx.array:
    """A linear or embedding layer's weight as floats (dequantized where quantized). The head's parameters start as
    the target's arrays and are replaced, never changed in place, by training."""
    if "scales" not in layer:
        return layer.weight
    return mx.dequantize(layer.weight, layer.scales, layer.get("biases"), layer.group_size, layer.bits)


def draft_vocab(shards: Shards, size: int, vocab: int) -> mx.array:
    """The `size` target ids the target most often puts first in the training data (sorted): what the head can say."""
    counts = mx.zeros((vocab,), dtype=mx.int32)
    for b in shards.batches(range(len(shards.files()))):
        counts = counts + mx.zeros((vocab,), dtype=mx.int32).at[b["ids"][..., 0].flatten()].add(1)
    return mx.sort(mx.argsort(-counts)[: min(size, vocab)]).astype(mx.int32)


def _attend(layer: eagle3.FirstLayer, embeds, hidden, step: int, kv: list):
    """The first layer at training-time-test step `step`: each position attends the real positions up to it (step 0's
    keys) and its own chain's earlier steps (each step's key at that position), as drafting does."""
    a = layer.self_attn
    normed = layer.hidden_norm(hidden)
    x = mx.concatenate([layer.input_layernorm(embeds), normed], axis=-1)
    B, L, _ = x.shape
    q = a.rope(a.q_proj(x).reshape(B, L, a.n_heads, -1).transpose(0, 2, 1, 3), offset=step)
    k = a.rope(a.k_proj(x).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3), offset=step)
    v = a.v_proj(x).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    rep = a.n_heads // a.n_kv_heads
    kv.append((mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)))
    k0, v0 = kv[0]
    causal = mx.triu(mx.full((L, L), -mx.inf), k=1)
    scores = [(q @ k0.transpose(0, 1, 3, 2)) * a.scale + causal]
    scores += [(q * kj).sum(-1, keepdims=True) * a.scale for kj, _ in kv[1:]]
    w = mx.softmax(mx.concatenate(scores, axis=-1), axis=-1)
    out = w[..., :L] @ v0
    for j, (_, vj) in enumerate(kv[1:]):
        out = out + w[..., L + j : L + j + 1] * vj
    out = a.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
    h = (normed if layer.norm_before_residual else hidden) + out
    return h + layer.mlp(layer.post_attention_layernorm(h))


def ttt(head: eagle3.Eagle3Head, batch: dict, t2d: mx.array, steps: int = STEPS):
    """(loss, per step: (positions correct, positions)) of the head on a batch of sequences: index p is fed token p + 1
    beside the target's states at p; step i predicts token p + i + 2 against the target's law at p + i + 1."""
    tokens, states = batch["tokens"], batch["states"].astype(mx.float32)
    ids, probs = batch["ids"], batch["probs"].astype(mx.float32)
    B, L = tokens.shape
    n = L - 1
    kv: list[tuple[mx.array, mx.array]]  # each step's keys and values (`_attend`)
    h, kv, loss, stats = head.fc(states[:, :n]), [], mx.array(0.0), []
    for i in range(steps):
        valid = (mx.arange(n) < n - i)[None]  # (1, n): token p + i + 1 and the law at p + i + 1 exist
        toks = mx.pad(tokens[:, 1 + i :], [(0, 0), (0, i)])
        h = _attend(head.layers[0], head.embed(toks), h, i, kv)
        logq = nn.log_softmax(head.logits(h).astype(mx.float32), axis=-1)  # (B, n, Vd)
        lab, p = mx.pad(ids[:, 1 + i :], [(0, 0), (0, i), (0, 0)]), mx.pad(probs[:, 1 + i :], [(0, 0), (0, i), (0, 0)])
        d = t2d[lab]  # draft ids of the target's top tokens, -1 outside the draft vocabulary
        w = mx.where(d >= 0, p, 0.0) * valid[..., None]
        ce = -(w * mx.take_along_axis(logq, mx.maximum(d, 0), axis=-1)).sum(-1) / mx.maximum(w.sum(-1), 1e-6)
        kept = (w.sum(-1) > 0) & valid
        loss = loss + DECAY**i * (ce * kept).sum() / mx.maximum(kept.sum(), 1)
        right = (head.ids()[mx.argmax(logq, -1)] == lab[..., 0]) & valid
        stats.append((right.sum(), valid.sum() * B))
    return loss, stats


def chain_acceptance(head, batch: dict, t2d: mx.array, steps: int = STEPS) -> list[float]:
    """Per draft position, the share of positions whose chain is accepted that far (each step right while every
    earlier one was), on a batch held out."""
    tokens, states, ids = batch["tokens"], batch["states"].astype(mx.float32), batch["ids"]
    n = tokens.shape[1] - 1
    kv: list[tuple[mx.array, mx.array]]
    h, kv, alive, out = head.fc(states[:, :n]), [], None, []
    for i in range(steps):
        toks = mx.pad(tokens[:, 1 + i :], [(0, 0), (0, i)])
        h = _attend(head.layers[0], head.embed(toks), h, i, kv)
        right = head.ids()[mx.argmax(head.logits(h), -1)] == mx.pad(ids[:, 1 + i :, 0], [(0, 0), (0, i)])
        # later steps were fed the data's token: a chain stays valid only where that token is the target's own
        follows = mx.pad(tokens[:, 2 + i :] == ids[:, 1 + i : -1, 0], [(0, 0), (0, i + 1)], constant_values=False)
        alive = right if alive is None else alive & right
        m = (mx.arange(n) < n - i - 1)[None]
        out.append(((alive & m).sum() / (m.sum() * tokens.shape[0])).item())
        alive = alive & follows
    return out


def train(
    target,
    plan: TrainingPlan,
    out: Path,
    seqs: list[list[int]],
    *,
    resume: bool = False,
    log: Callable[[str], None] = lambda _m: None,
    checkpoint_minutes: float = 10.0,
    started: float | None = None,
) -> Path:
    """Train a head for `target` on `seqs` within `plan.minutes` from `started` (default: now; the features first, up
    to `plan.data_share` of the time) and `plan.max_steps`, at least one step, and save it in `out` (the speculators
    layout; `eagle3:OUT` loads it). Ctrl-C keeps the last checkpoint."""
    if plan.minutes is None and plan.max_steps is None:
        raise SourceError("a training run needs a budget: minutes, steps or both")
    started, state = started or time.time(), out / "train.json"
    deadline = None if plan.minutes is None else started + plan.minutes * 60
    check_out(out, resume)
    if resume:
        done = json.loads(state.read_text())
        plan = TrainingPlan(**{**done, "minutes": plan.minutes, "max_steps": plan.max_steps})
    out.mkdir(parents=True, exist_ok=True)
    shards = Shards(out / "data")
    bytes_per_token = len(plan.reads) * text_of(target).args.hidden_size * 2 + TOP * 6 + 4
    if plan.max_steps is not None:  # no more features than the steps can read
        seqs = seqs[: plan.max_steps * plan.batch + HELD]
    with progress(total=sum(map(len, seqs)), desc="target states", unit="tok", initial=shards.tokens()) as bar:
        shards.write(
            target,
            seqs,
            plan.reads,
            bytes_per_token,
            plan.limit_gb,
            until=None if plan.minutes is None else started + plan.minutes * 60 * plan.data_share,
            bar=bar,
        )
    held = plan.held if plan.held is not None else held_out(shards.count())
    plan = replace(plan, held=held)
    if not held:
        log("a single training sequence: none is held out, so acceptance along the way is measured on it")
    vocab = text_of(target).vocab_size
    ids = draft_vocab(shards, plan.draft_vocab, vocab)
    t2d = mx.full((vocab,), -1, dtype=mx.int32).at[ids].add(mx.arange(ids.size, dtype=mx.int32) + 1)
    head = initial_head(target, plan.reads, ids)
    if resume and (out / eagle3.FILE).is_file():
        head.load_weights(str(out / eagle3.FILE), strict=False)
    opt = optim.AdamW(learning_rate=plan.lr, weight_decay=0.0)
    if resume and (out / OPTIMIZER).is_file():
        opt.state = tree_unflatten(list(safetensors(out / OPTIMIZER).items()))
    grad = nn.value_and_grad(head, lambda m, b: ttt(m, b, t2d)[0])
    held_batch = shards.held_out(plan.held or 1)
    steps, last_save, curve = plan.done.get("steps", 0), time.time(), plan.done.get("curve", [])
    first, most = steps, plan.max_steps or math.inf

    def spent() -> float:  # the share of the budget used: of its minutes or of its steps, whichever ends first
        return max(0.0 if plan.minutes is None else (time.time() - started) / (plan.minutes * 60), steps / most)

    def more() -> bool:  # a run trains at least one step, then while its budget lasts
        return steps < most and (steps == first or deadline is None or time.time() < deadline)

    if not curve:  # where the head starts (the target's last block): the first point of the learning curve
        curve.append(_point(head, held_batch, t2d, steps, started, plan))
        log(f"step 0: held-out acceptance by position {curve[-1]['acceptance']}")
    order = list(range(len(shards.files())))
    with progress(total=100, desc="training", unit="%", initial=int(100 * spent())) as bar:
        try:
            while more():
                random.Random(steps).shuffle(order)
                for b in shards.batches(order, plan.batch, held=held):
                    opt.learning_rate = learning_rate(plan, steps, spent())
                    loss, g = grad(head, b)
                    g, _ = optim.clip_grad_norm(g, 1.0)
                    opt.update(head, g)
                    mx.eval(head.parameters(), opt.state, loss)
                    steps += 1
                    bar.n = min(100, int(100 * spent()))
                    bar.set_postfix(loss=f"{loss.item():.3f}", steps=steps)
                    if time.time() - last_save > checkpoint_minutes * 60:
                        curve.append(_point(head, held_batch, t2d, steps, started, plan))
                        _save(head, opt, out, plan, steps, curve, shards)
                        last_save = time.time()
                        log(f"step {steps}: held-out acceptance by position {curve[-1]['acceptance']}")
                    if not more():
                        break
        except KeyboardInterrupt:
            log("interrupted: the last checkpoint stays; --resume goes on from it")
            raise
    curve.append(_point(head, held_batch, t2d, steps, started, plan))
    _save(head, opt, out, plan, steps, curve, shards)
    return out


def check_out(out: Path, resume: bool) -> None:
    """Refuse, in one line, a folder that holds a head (or anything but the data of a run stopped before its first
    checkpoint, which is taken up again) unless resuming, and resuming where nothing was saved."""
    if resume and not (out / "train.json").is_file():
        raise SourceError(f"{out}: nothing to resume (no train.json)")
    if not resume and out.exists() and any(p.name != "data" for p in out.iterdir()):
        raise SourceError(f"{out} exists and is not empty: pass --resume to go on, or another folder")


def learning_rate(plan: TrainingPlan, steps: int, elapsed: float) -> float:
    """The rate at a step: linear warmup over `plan.warmup` steps, then a cosine over the budget (`elapsed`, its share
    spent) down to a tenth (the steps a budget of minutes holds are not known in advance)."""
    return plan.lr * min(1.0, (steps + 1) / plan.warmup) * (0.55 + 0.45 * math.cos(math.pi * min(1.0, elapsed)))


def _point(head, batch, t2d, steps: int, started: float, plan: TrainingPlan) -> dict:
    acc = chain_acceptance(head, batch, t2d)
    return {
        "steps": steps,
        "minutes": round((time.time() - started) / 60 + plan.done.get("minutes", 0.0), 2),
        "acceptance": [round(a, 4) for a in acc],
        "tau": round(1 + sum(acc), 3),
    }


def _save(head, opt, out: Path, plan: TrainingPlan, steps: int, curve: list, shards: Shards) -> None:
    """The head in the speculators layout, beside its optimizer's state and its training record (each file written
    whole or not at all)."""
    weights = eagle3.tensors(head)
    tmp = out / ".model.tmp.safetensors"
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    mx.save_safetensors(str(out / ".opt.tmp.safetensors"), dict(tree_flatten(opt.state)))
    (out / ".opt.tmp.safetensors").replace(out / OPTIMIZER)
    config = head.config.to_dict()
    config["mlx_spec"] = {
        "source": "train-head",
        "target": plan.target,
        "tokens": shards.tokens(),
        "steps": steps,
        "curve": curve,
    }
    (out / ".config.tmp.json").write_text(json.dumps(config, indent=2))
    done = dict(
        asdict(plan),
        done={
            "steps": steps,
            "curve": curve,
            "tokens": shards.tokens(),
            "minutes": curve[-1]["minutes"] if curve else 0.0,
        },
    )
    (out / ".train.tmp.json").write_text(json.dumps(done, indent=2))
    tmp.replace(out / eagle3.FILE)
    (out / ".config.tmp.json").replace(out / "config.json")
    (out / ".train.tmp.json").replace(out / "train.json")
