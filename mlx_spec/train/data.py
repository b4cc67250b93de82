"""What a head learns from: token sequences (the user's text, the target's own replies, or a default mix that ships
with this machine) and, per position, the target's states at the blocks the head reads and its next-token law (its
top tokens), computed in chunks into shards on disk of a bounded size."""

import json
import random
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

import mlx.core as mx

from ..errors import SourceError
from ..gen import hidden
from ..make.importance import vocabulary_texts
from ..make.paths import ensure_free_space
from ..models.drafter_weights import safetensors

TOP = 4  # the target's top tokens kept per position: its law, truncated
TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".json")


def default_texts() -> list[str]:
    """Code and prose that ship with this machine's Python: the calibration text and the standard-library modules of
    a draft head's vocabulary, the rest of the standard library's sources, and its documentation's prose (pydoc
    topics)."""
    import pydoc_data.topics

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py")) if p.stat().st_size < 200_000]
    return vocabulary_texts() + list(pydoc_data.topics.topics.values()) + code


def read_texts(paths: Sequence[str]) -> list[str]:
    """The text of each file, and of each text file under each folder."""
    out = []
    for p in map(Path, paths):
        p = p.expanduser()
        if p.is_dir():
            out += [
                f.read_text(errors="ignore") for f in sorted(p.rglob("*")) if f.suffix in TEXT_SUFFIXES and f.is_file()
            ]
        elif p.is_file():
            out.append(p.read_text(errors="ignore"))
        else:
            raise SourceError(f"--data {p}: no such file or folder")
    return out


# Open questions for the default self-distillation asks: topics apart from the benchmark's prose questions.
TOPICS = (
    "coral reefs",
    "the Silk Road",
    "electric cars",
    "learning a second language",
    "composting",
    "the Renaissance",
    "chess",
    "jazz",
    "film photography",
    "hiking safety",
    "saving for retirement",
    "the human heart",
    "rainforests",
    "the Industrial Revolution",
    "public libraries",
    "earthquakes",
    "balcony gardening",
    "time management",
    "recycling plastics",
    "the Olympic Games",
    "the telephone",
    "penguins",
    "deserts",
    "the Great Wall of China",
    "mountaineering",
    "cooking rice",
    "the metric system",
    "bird migration",
    "remote work",
    "public speaking",
    "the Apollo program",
    "solar power",
    "rivers and floods",
    "friendship",
    "museums",
    "minimalism",
    "ancient Egypt",
    "the theatre",
    "volunteering",
    "board games",
    "wind turbines",
    "coffee",
    "castles",
    "lightning",
    "volcanoes",
)
ASKS = (
    "Explain {} to a curious teenager in a few paragraphs.",
    "What are common misconceptions about {}?",
    "Write a short essay about {}.",
    "Give practical advice to a beginner interested in {}.",
    "Summarize the history of {}.",
    "What are the advantages and disadvantages of {}?",
)
CODE_ASK = (
    "Complete the following Python function. Reply with the whole function in one ```python code block.\n"
    "```python\n{}```"
)


def default_asks() -> list[str]:
    """Requests like the ones a head serves, that need no network: open questions (`ASKS` x `TOPICS`) and code to
    complete (the signature and docstring of standard-library functions), alternating."""
    import ast

    stubs = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for f in tree.body:
            if not isinstance(f, ast.FunctionDef):
                continue
            doc = ast.get_docstring(f)
            if doc and not f.name.startswith("_") and 60 <= len(doc) <= 600:
                doc = "\n    ".join(doc.splitlines())
                stubs.append(CODE_ASK.format(f'def {f.name}({ast.unparse(f.args)}):\n    """{doc}\n    """\n'))
    prose = [a.format(t) for t in TOPICS for a in ASKS]
    random.Random(0).shuffle(stubs)
    random.Random(1).shuffle(prose)
    return [a for pair in zip(prose, stubs) for a in pair]


def replies(
    target,
    tokenizer,
    prompts: Sequence[str],
    max_tokens: int,
    until: float | None = None,
    batch: int = 32,
    log=lambda _m: None,
) -> list[list[int]]:
    """Each prompt through the chat template, followed by the target's own greedy reply (self-distillation: what the
    head will draft), `batch` prompts at a time through mlx-lm's `batch_generate`, until the time `until`."""
    import time

    from mlx_lm.generate import batch_generate

    out = []
    for start in range(0, len(prompts), batch):
        if until is not None and time.time() > until:
            break
        ids = [
            list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
            if getattr(tokenizer, "chat_template", None)
            else tokenizer.encode(text)
            for text in prompts[start : start + batch]
        ]
        got = batch_generate(
            target,
            tokenizer,
            ids,
            max_tokens=max_tokens,
            return_token_ids=True,
            completion_batch_size=len(ids),
            prefill_batch_size=len(ids),
        )
        replies = got.token_ids
        assert replies is not None  # asked for with return_token_ids
        out += [p + r for p, r in zip(ids, replies)]
        log(f"replies {len(out)}/{len(prompts)}: {sum(map(len, replies))} tokens in this batch")
    return out


def sequences(
    tokenizer, texts: Sequence[str], length: int, exclude: Sequence[str] = (), streams: Sequence[list[int]] = ()
) -> list[list[int]]:
    """The token `streams` (the target's replies), then the texts' tokens, EOS between them, cut into sequences of
    `length`, the replies' first (each part shuffled, seeded: the features a budget has time for are the replies, then
    a sample of the text); a text holding any of `exclude` (the benchmark prompts) is left out."""
    eos = getattr(tokenizer, "eos_token_ids", None) or [0]
    stream: list[int] = []
    for ids in streams:
        stream += list(ids) + [min(eos)]
    first = [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]
    stream = stream[len(first) * length :]
    from transformers.utils import logging as hf_logging

    quiet, level = hf_logging.set_verbosity_error, hf_logging.get_verbosity()
    quiet()  # a whole file is longer than the model's context; it is cut into sequences here, so no warning
    try:
        for t in texts:
            if t.strip() and not any(e in t for e in exclude):
                stream += tokenizer.encode(t) + [min(eos)]
    finally:
        hf_logging.set_verbosity(level)
    rest = [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]
    if not first and not rest:
        raise SourceError(
            f"the training text holds {len(stream)} tokens: {length - len(stream)} more make one sequence of {length}"
            " (or a shorter --length)"
        )
    random.Random(0).shuffle(first)
    random.Random(0).shuffle(rest)
    return first + rest


def features(target, seq: list[int], reads: Sequence[int]):
    """(states (L, n * d) float16, top ids (L, TOP) int32, their probabilities among the top (L, TOP) float16) of the
    target on `seq`. The loss weighs the top tokens against each other only, so their softmax is taken over the top
    logits, not over the whole vocabulary (a pass over 151k logits a position costs a fifth of the target's pass)."""
    run = hidden.taps(target, tuple(sorted(set(reads))))
    logits, states = run(mx.array(seq)[None], None)
    states = hidden.pick(states[0], run.reads, tuple(reads))
    logits = logits[0].astype(mx.float32)
    top = mx.argpartition(logits, -TOP, axis=-1)[:, -TOP:]
    order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
    ids = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
    probs = mx.softmax(mx.take_along_axis(logits, ids, axis=-1), axis=-1)
    return states.astype(mx.float16), ids, probs.astype(mx.float16)


class Shards:
    """The features of the training sequences on disk, a shard per `per` sequences, in `folder`."""

    def __init__(self, folder: Path, per: int = 8):
        self.folder, self.per = Path(folder), per
        self.folder.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("shard-*.safetensors"))

    def tokens(self) -> int:
        meta = self.folder / "meta.json"
        return json.loads(meta.read_text())["tokens"] if meta.is_file() else 0

    def count(self) -> int:
        """The sequences on disk."""
        return sum(safetensors(f)["tokens"].shape[0] for f in self.files())

    def write(
        self,
        target,
        seqs: list[list[int]],
        reads: Sequence[int],
        bytes_per_token: int,
        limit_gb: float,
        until: float | None = None,
        bar=None,
    ) -> int:
        """Compute and write the shards still missing (resumable) until the time `until` or `limit_gb` is reached,
        the first one whatever the time (a run trains on what it has); returns the tokens on disk."""
        import time

        done = len(self.files())
        tokens = self.tokens()
        for start in range(done * self.per, len(seqs), self.per):
            late = until is not None and time.time() > until
            if tokens and (late or (tokens * bytes_per_token) / 1e9 > limit_gb):
                break
            part = seqs[start : start + self.per]
            ensure_free_space(self.folder, len(part) * len(part[0]) * bytes_per_token * 2, "the training features")
            out = {"tokens": mx.array(part, dtype=mx.int32)}
            got = [features(target, s, reads) for s in part]
            for j, name in enumerate(("states", "ids", "probs")):
                out[name] = mx.stack([g[j] for g in got])
            path = self.folder / f"shard-{start // self.per:05d}.safetensors"
            tmp = path.with_name(f".{path.stem}.tmp.safetensors")  # renamed when whole: a shard is never half there
            mx.save_safetensors(str(tmp), out)
            tmp.replace(path)
            tokens += sum(map(len, part))
            (self.folder / "meta.json").write_text(json.dumps({"tokens": tokens}))
            if bar is not None:
                bar.update(sum(map(len, part)))
        return tokens

    def batches(self, order: Sequence[int], size: int | None = None, held: int = 0) -> Iterator[dict]:
        """The shards in `order`, loaded one at a time, each whole or in batches of `size` sequences; the first
        `held` sequences of the first shard (those held out) left out."""
        files = self.files()
        for i in order:
            shard = safetensors(files[i])
            n = shard["tokens"].shape[0]
            for j in range(held if i == 0 else 0, n, size or n):
                yield {k: v[j : j + (size or n)] for k, v in shard.items()}

    def held_out(self, held: int) -> dict:
        """The first `held` sequences of the first shard as one batch: what acceptance along the way is measured on."""
        return {k: v[:held] for k, v in safetensors(self.files()[0]).items()}
