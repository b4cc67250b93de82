"""A whole `train-head` run over a loaded target: its text (the user's, the target's own replies, or the default mix,
held-out prompts left out), the memory and disk it will take said first, then `head.train`; and where heads live."""

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import SourceError
from ..make.paths import atomic_file, home
from ..models.base import params_bytes, text_of
from ..models.eagle3 import default_reads
from . import data as td
from .head import TrainingPlan, check_out, train

Log = Callable[[str], None]
REPLIES = "replies.json"  # the target's replies, kept beside the features


def heads_dir() -> Path:
    """Where trained heads go unless told otherwise (and where `draft-search` looks for them)."""
    return home() / "heads"


def default_out(target: str) -> Path:
    return heads_dir() / re.sub(r"[^A-Za-z0-9._-]+", "_", Path(target).name if "/" in target else target)


def heads_for(target: str) -> list[Path]:
    """The trained heads in `heads_dir()` whose training record names `target`."""
    out = []
    for f in sorted(heads_dir().glob("*/train.json")):
        try:
            if json.loads(f.read_text()).get("target") == target and (f.parent / "config.json").is_file():
                out.append(f.parent)
        except (OSError, ValueError):
            continue
    return out


def _replies(
    model,
    tokenizer,
    path: Path,
    regenerate: Path | None,
    held: Sequence[str],
    tokens: int,
    until: float | None,
    log: Log,
) -> list[list[int]]:
    """The target's replies to the `regenerate` prompts (`default`: `td.default_asks`), generated once and kept in
    `path` (so that a resumed or restarted run trains on the same sequences); none without `regenerate`."""
    if path.is_file():
        return json.loads(path.read_text())
    if regenerate is None:
        return []
    if str(regenerate) == "default":
        asks = td.default_asks()
    elif regenerate.is_file():
        asks = [line.strip() for line in regenerate.read_text().splitlines() if line.strip()]
    else:
        raise SourceError(f"--regenerate {regenerate}: no such file (or `default`)")
    streams = td.replies(model, tokenizer, [a for a in asks if a not in held], tokens, until=until, log=log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_file(path)
    tmp.write_text(json.dumps(streams))
    tmp.replace(path)
    return streams


def run(
    model,
    tokenizer,
    target: str,
    out: Path,
    *,
    held: Sequence[str],
    data: Sequence[str] = (),
    regenerate: Path | None = None,
    reply_tokens: int = 256,
    minutes: float | None = 120.0,
    max_steps: int | None = None,
    draft_vocab: int = 8192,
    length: int = 512,
    batch: int = 2,
    limit_gb: float = 4.0,
    resume: bool = False,
    log: Log = lambda _m: None,
) -> Path:
    """Train a head for `model` (named `target` in its record) into `out` for `minutes` and at most `max_steps` (None:
    no clock, the steps alone); `held`: prompts kept out of the text."""
    import time

    started = time.time()
    check_out(out, resume)  # before anything runs
    args = text_of(model).args
    d, inter = args.hidden_size, args.intermediate_size
    params = 3 * d * d + 8 * d * d + 3 * d * inter + d * draft_vocab  # fc, attention (q/k/v read 2 d), MLP, head
    weights = params_bytes(model)
    step = batch * length * (draft_vocab * 4 * 3 * 3 + 14 * length * 4 * 3)  # logits, attention, 3 steps, kept
    log(
        f"training uses about {(weights + params * 16 + step) / 1e9:.1f} GB of memory (the target, the head with "
        "its optimizer, a batch)"
    )
    log(f"{len(held)} benchmark prompts (HumanEval, prose) are kept out of the training text")
    texts = td.read_texts(data) if data else td.default_texts()
    until = None if minutes is None else started + minutes * 60 / 4
    streams = _replies(model, tokenizer, out / "data" / REPLIES, regenerate, held, reply_tokens, until, log)
    share = 0.5 if streams else 0.4  # replies up to a quarter of the minutes, then the features up to half
    seqs = td.sequences(tokenizer, texts, length, exclude=held, streams=streams)
    plan = TrainingPlan(
        target,
        default_reads(len(model.layers)),
        draft_vocab,
        length,
        minutes,
        data_share=share,
        lr=3e-4,
        batch=batch,
        max_steps=max_steps,
        limit_gb=limit_gb,
        data=([str(d) for d in data] or ["default"]) + ([f"replies:{regenerate}"] if streams else []),
    )
    log(
        f"{len(seqs)} sequences of {length} tokens; the target's features take up to "
        f"{min(limit_gb, len(plan.reads) * d * 2 * len(seqs) * length / 1e9):.2f} GB of disk"
    )
    return train(model, plan, out, seqs, resume=resume, log=log, started=started)
