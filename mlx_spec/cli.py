"""The `mlx-spec` command line: thin typer commands over the library."""

import sys
from pathlib import Path

import typer

from . import blas
from .bench.common import DEFAULT_OUT
from .bench.draft_search import DEFAULT_LADDER as DS_LADDER
from .bench.draft_search import DEFAULT_MAX_TOKENS as DS_MAX_TOKENS
from .bench.draft_search import DEFAULT_PROMPTS as DS_PROMPTS
from .errors import MlxSpecError
from .gen.tunables import DEFAULT_MAX_TOKENS
from .make.convert import DEFAULT_GROUP_SIZE
from .make.prune import SPEC_HELP as PRUNE_HELP
from .make.quant import QUANTIZE_HELP, parse_quantize
from .named import (
    DEFAULT_DRAFT,
    DEFAULT_MODEL,
    DEFAULT_PROMPT,
    DRAFT_HELP,
    MODEL_HELP,
    NUM_DRAFT_HELP,
)
from .server.defaults import (
    DEFAULT_HOST,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_PORT,
    PREFIX_CACHE_BYTES,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Lossless speculative decoding on MLX: fetch, convert, generate, chat, serve, bench.",
)


def _log(msg: str) -> None:
    typer.echo(f"[mlx-spec] {msg}", err=True)


def _hint() -> None:
    if h := blas.hint():
        typer.echo(h, err=True)


def _layer_list(text: str | None):
    from .errors import ConvertError

    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConvertError(f"--layers must be comma-separated integers, got '{text}'") from None


@app.command()
def fetch(name: str = typer.Argument(..., help="Recipe name, HF repo id, local folder or .gguf file")):
    """Fetch (and convert, for recipes) a model into the cache; print its folder."""
    from .make.resolve import resolve

    typer.echo(str(resolve(name, _log)))


@app.command()
def models():
    """List the named recipes, where each comes from, and whether it is on disk."""
    from .make import recipes
    from .make.paths import home
    from .make.resolve import is_cached, recipe_path

    rows = [(r.name, "yes" if is_cached(r) else "no", r.origin, r.description) for r in recipes.all_recipes()]
    width = max((len(r[0]) for r in rows), default=4)
    typer.echo(f"{'recipe':<{width}}  on disk  source")
    for name, cached, origin, _desc in rows:
        typer.echo(f"{name:<{width}}  {cached:<7}  {origin}")
    typer.echo(f"\ncache: {home()} (set MLX_SPEC_HOME to move it); converted folders: {recipe_path('<recipe>')}")


@app.command()
def convert(
    source: str = typer.Argument(..., help="HF repo id, local HF/MLX folder, .gguf file or recipe"),
    out: str = typer.Argument(..., help="Output MLX folder (must not exist unless --force)"),
    dtype: str = typer.Option("auto", help="auto|float32|float16|bfloat16 (auto: bfloat16 on GPU, float32 on CPU)"),
    quantize: str | None = typer.Option(None, "--quantize", "-q", help=QUANTIZE_HELP),
    group_size: int = typer.Option(DEFAULT_GROUP_SIZE, help="Affine quantization group size: 32|64|128"),
    head_bits: int | None = typer.Option(None, help="Bits for embedding and lm_head (16 keeps them float)"),
    keep_layers: int | None = typer.Option(None, help="Keep K blocks, picked by --layer-pick"),
    layer_pick: str = typer.Option(
        "even",
        help="How --keep-layers picks: even (first and last kept), first (the "
        "first K), importance (the K that change their input most on --calibration)",
    ),
    layers: str | None = typer.Option(None, help="Explicit blocks to keep, e.g. 0,4,8,11 or 0-5"),
    prune: str | None = typer.Option(
        None,
        help=f"Magnitude pruning of the blocks' linear weights: {PRUNE_HELP}. "
        "MLX has no sparse kernels: pruned weights are stored and run dense "
        "(quantized if asked), so pruning alone saves no memory or time",
    ),
    calibration: Path | None = typer.Option(
        None,
        help="Calibration text for --layer-pick importance "
        "(passages split by two blank lines; default: the project's own)",
    ),
    force: bool = typer.Option(False, help="Replace an existing output folder"),
):
    """Convert a model into an MLX folder, optionally shrunk into a draft: layer-drop, prune, quantize."""
    from .make.resolve import convert as run

    _hint()
    bits, mode = parse_quantize(quantize)
    path = run(
        source,
        out,
        dtype=dtype,
        quantize=bits,
        quant_mode=mode,
        group_size=group_size,
        head_bits=head_bits,
        keep_layers=keep_layers,
        layer_pick=layer_pick,
        layers=_layer_list(layers),
        prune=prune,
        calibration=calibration,
        force=force,
        log=_log,
    )
    typer.echo(str(path))


# The options `generate` and `chat` share: one definition each, so they mean the same in both.
MODEL = typer.Option(DEFAULT_MODEL, help=MODEL_HELP)
NUM_DRAFT = typer.Option(None, help=NUM_DRAFT_HELP)
TEMP = typer.Option(0.0, help="Sampling temperature (0: greedy)")
TOP_P = typer.Option(0.0, help="Nucleus sampling threshold (0: off)")
TOP_K = typer.Option(0, help="Top-k sampling (0: off)")
SEED = typer.Option(None, help="Random seed")
ADAPTIVE = typer.Option(True, help="Adapt K and switch speculation off when it does not pay")


@app.command()
def generate(
    text: str | None = typer.Argument(None, metavar="PROMPT", help="Prompt text (or --prompt)", show_default=False),
    model: str = MODEL,
    prompt: str | None = typer.Option(None, help=f"Prompt text, as the argument (default: {DEFAULT_PROMPT!r})"),
    draft: str | None = typer.Option(None, help=DRAFT_HELP),
    num_draft: int | None = NUM_DRAFT,
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, help="Max new tokens"),
    temp: float = TEMP,
    top_p: float = TOP_P,
    top_k: int = TOP_K,
    seed: int | None = SEED,
    adaptive: bool = ADAPTIVE,
    chat: bool = typer.Option(True, help="Wrap the prompt in the tokenizer's chat template, if it has one"),
    verbose: bool = typer.Option(False, help="Print the statistics"),
    shard: str | None = typer.Option(
        None, help="Split the target over the ranks `mlx.launch` starts: tensor or pipeline (rank 0 prints)"
    ),
    link_latency_us: float | None = typer.Option(
        None, help="With --shard: a simulated slower link, a wait of this many µs after each collective"
    ),
):
    """Stream text from a model, plain or speculative (the output is the target's either way)."""
    import contextlib

    import mlx.core as mx

    from .cluster import Agreed, Cluster, ClusterError
    from .cluster.link import Link, Marked
    from .device import describe
    from .gen import registry
    from .gen.stream import stream_generate
    from .make.resolve import resolve
    from .named import load_pair, make_drafter

    if text is not None and prompt is not None:
        raise MlxSpecError("give the prompt as the argument or as --prompt, not both")
    prompt = text if text is not None else prompt if prompt is not None else DEFAULT_PROMPT
    _hint()
    spec = registry.parse(draft)  # once: every layer below takes the parsed spec
    cluster = Cluster.join(shard) if shard is not None else None
    if link_latency_us is not None and cluster is None:
        raise ClusterError("--link-latency-us simulates the link between ranks: it needs --shard")
    if seed is not None:
        mx.random.seed(seed)
    if cluster is None:
        target, tok, drafter = load_pair(model, spec, log=_log)
    else:
        folder = resolve(model, _log)
        spec = cluster.drafter(spec, folder)  # refused before the target loads where it cannot run sharded
        target, tok = cluster.load(folder)
        drafter = make_drafter(spec, target, tok, log=_log)
        cluster.agree_seed(seed)  # every rank samples alike; and no rank starts before all have loaded
    link = Link(link_latency_us * 1e-6) if link_latency_us is not None else None
    planner = Agreed(adaptive=adaptive, cluster=cluster) if cluster is not None else None
    if cluster is not None and link is not None:
        planner = Marked(adaptive=adaptive, cluster=cluster, link=link)
    shown = cluster is None or cluster.lead
    ids = (
        tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        if chat and getattr(tok, "chat_template", None)
        else tok.encode(prompt)
    )
    ev = None
    with (
        cluster.guard() if cluster is not None else contextlib.nullcontext(),
        link.installed() if link is not None else contextlib.nullcontext(),
    ):
        for ev in stream_generate(
            target,
            tok,
            ids,
            drafter,
            max_tokens=max_tokens,
            temp=temp,
            top_p=top_p,
            top_k=top_k,
            num_draft=num_draft,
            adaptive=adaptive,
            planner=planner,
        ):
            if shown:
                typer.echo(ev.text, nl=False)
    if not shown:
        return
    typer.echo("")
    if link is not None:
        t = link.tally
        typer.echo(
            f"link:       simulated, {link_latency_us:g} µs waited after each of {t.collectives} collectives "
            f"({t.waited:.3f} s waited, {t.measured:.3f} s in the collectives themselves)",
            err=True,
        )
    if verbose and ev is not None:
        typer.echo(format_stats(ev.stats, drafter is not None), err=True)
        typer.echo(f"device:     {describe()}", err=True)


@app.command()
def chat(
    model: str = MODEL,
    draft: str = typer.Option(DEFAULT_DRAFT, help=DRAFT_HELP),
    system: str | None = typer.Option(None, help="System message"),
    num_draft: int | None = NUM_DRAFT,
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, help="Max new tokens per reply"),
    temp: float = TEMP,
    top_p: float = TOP_P,
    top_k: int = TOP_K,
    seed: int | None = SEED,
    adaptive: bool = ADAPTIVE,
    shard: str | None = typer.Option(
        None,
        help="Split the target over the ranks `mlx.launch` starts: tensor or pipeline (rank 0 reads and prints; a "
        "reply runs to its end, Ctrl-C ends the chat)",
    ),
):
    """Chat in the terminal; after each reply: tokens/s, drafts and acceptance, a speed-up estimate. /help: commands."""
    from .chat.repl import run
    from .gen import registry

    _hint()
    run(
        model=model,
        draft=registry.parse(draft),
        system=system,
        num_draft=num_draft,
        max_tokens=max_tokens,
        temp=temp,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        adaptive=adaptive,
        log=_log,
        shard=shard,
    )


@app.command()
def serve(
    model: str = MODEL,
    draft: str = typer.Option(DEFAULT_DRAFT, help=DRAFT_HELP),
    host: str = typer.Option(DEFAULT_HOST, help="Address to bind (another than 127.0.0.1 exposes the server)"),
    port: int = typer.Option(DEFAULT_PORT, help="Port (0: any free port)"),
    api_key: str | None = typer.Option(
        None,
        envvar="MLX_SPEC_API_KEY",
        help="Require 'Authorization: Bearer KEY' on the API (the command line shows it to `ps`: prefer the "
        "environment variable or --api-key-file)",
    ),
    api_key_file: Path | None = typer.Option(None, help="Read the API key from this file (its one line)"),
    allowed_hosts: list[str] = typer.Option(
        [],
        help="A name the server answers to beside localhost, 127.0.0.1, [::1] and --host, e.g. a LAN name "
        "(repeatable; '*': any). Other Host headers get a 403, which stops DNS-rebinding pages",
    ),
    cors_origin: str | None = typer.Option(
        None, help="The one web origin whose pages may call the API, e.g. http://localhost:3000 (default: none)"
    ),
    allow_draft: list[str] = typer.Option(
        [],
        help="A drafter requests may also pick (repeatable), built at start, e.g. quant-self or a draft model; by "
        "default they pick only drafters that build nothing or the loaded draft",
    ),
    max_concurrency: int = typer.Option(
        DEFAULT_MAX_CONCURRENCY,
        help="Requests generating at once (each holds its own caches); more wait in a FIFO queue",
    ),
    num_draft: int | None = NUM_DRAFT,
    adaptive: bool = ADAPTIVE,
    max_tokens: int | None = typer.Option(
        None, help="Max new tokens when a request gives none (default: up to the end of the context)"
    ),
    fixed_draft: bool = typer.Option(
        False,
        help="Requests may not switch the drafter (by default a request's "
        '"draft" field, or the page\'s menu, picks any drafter that loads or builds no weights)',
    ),
    batch: bool = typer.Option(
        True,
        help="Requests that start while others generate are verified together, one "
        "forward pass per round for all (--no-batch: each request takes its own turns)",
    ),
    prefix_cache_bytes: int = typer.Option(
        PREFIX_CACHE_BYTES,
        help="Bytes of KV cache kept for prompt prefixes that conversations share (a system prompt and tools), "
        "least recently used out first (0: none)",
    ),
    shard: str | None = typer.Option(
        None,
        help="Split the target over the ranks `mlx.launch` starts: tensor or pipeline (rank 0 serves, one request at "
        "a time; the others follow)",
    ),
):
    """Serve the web chat at / and an OpenAI-compatible API at /v1, speculating for every concurrent request."""
    from .gen import registry
    from .server.main import serve as run

    _hint()
    spec = registry.parse(draft)
    if not 0 <= port <= 65535:
        raise MlxSpecError(f"--port must be 0..65535, got {port}")
    if max_concurrency < 1:
        raise MlxSpecError(f"--max-concurrency must be at least 1, got {max_concurrency}")
    if prefix_cache_bytes < 0:
        raise MlxSpecError(f"--prefix-cache-bytes must be >= 0, got {prefix_cache_bytes}")
    if max_tokens is not None and max_tokens < 1:
        raise MlxSpecError(f"--max-tokens must be at least 1, got {max_tokens}")
    run(
        model=model,
        draft=spec,
        host=host,
        port=port,
        api_key=api_key,
        api_key_file=api_key_file,
        allowed_hosts=allowed_hosts,
        cors_origin=cors_origin,
        allow_draft=[registry.parse(d) for d in allow_draft],
        max_concurrency=max_concurrency,
        num_draft=num_draft,
        adaptive=adaptive,
        max_tokens=max_tokens,
        fixed_draft=fixed_draft,
        batch=batch,
        prefix_cache_bytes=prefix_cache_bytes,
        shard=shard,
        log=_log,
    )


@app.command("train-head")
def train_head(
    target: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    out: Path | None = typer.Option(
        None,
        help="Folder for the head (then `--draft eagle3:OUT`), its data and its "
        "record (default: heads/TARGET in the cache, where draft-search finds it)",
    ),
    data: list[str] = typer.Option(
        [], help="Text files or folders to train on (default: code and prose that ship with this machine's Python)"
    ),
    regenerate: Path | None = typer.Option(
        None,
        help="Prompts (one per line) whose replies by the target are "
        "trained on first (self-distillation; up to a quarter of the budget); "
        "`default`: open questions and standard-library functions to complete",
    ),
    reply_tokens: int = typer.Option(256, help="Tokens of each regenerated reply"),
    budget_minutes: float = typer.Option(120.0, help="Time for the whole run, the target's features included"),
    max_steps: int | None = typer.Option(None, help="Stop after this many training steps, if the time lasts"),
    draft_vocab: int = typer.Option(8192, help="Tokens the head can draft (the ones the target says most often)"),
    length: int = typer.Option(512, help="Tokens per training sequence"),
    batch: int = typer.Option(2, help="Sequences per training step"),
    limit_gb: float = typer.Option(4.0, help="Most disk the target's features take (their data stops there)"),
    resume: bool = typer.Option(False, help="Go on from OUT's last checkpoint"),
):
    """Train an EAGLE-3 head for TARGET on this machine (MLX, training-time test); saved in the published layout."""
    from .bench.prompts import PROSE_QUESTIONS, build
    from .named import load_model
    from .train import job

    _hint()
    model, tokenizer, _ = load_model(target, _log)
    held = [p.text for p in build(tokenizer, 164, 0, n_prose=len(PROSE_QUESTIONS))]
    out = job.run(
        model,
        tokenizer,
        target,
        out or job.default_out(target),
        held=held,
        data=data,
        regenerate=regenerate,
        reply_tokens=reply_tokens,
        minutes=budget_minutes,
        max_steps=max_steps,
        draft_vocab=draft_vocab,
        length=length,
        batch=batch,
        limit_gb=limit_gb,
        resume=resume,
        log=_log,
    )
    typer.echo(str(out))


@app.command("draft-search")
def draft_search(
    target: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    budget_minutes: float = typer.Option(60.0, help="Time the search may take; it ranks cheaply first to keep it"),
    calibration: Path | None = typer.Option(
        None, help="Calibration prompts (passages split by two blank lines; default: the project's own)"
    ),
    prompt_set: str = typer.Option(
        "",
        help="Measure on the benchmark's prompts of these sets instead of the "
        "calibration text (comma list of humaneval, edit, prose; e.g. humaneval,edit "
        "for a coder model, where the context drafters do best)",
    ),
    prompts: int = typer.Option(DS_PROMPTS, help="Calibration prompts per full measurement"),
    max_tokens: int = typer.Option(DS_MAX_TOKENS, help="Tokens generated per prompt"),
    methods: str = typer.Option(
        ",".join(DS_LADDER),
        help="Compression methods to make drafts with (convert's "
        "draft methods: int8, int4, mxfp4, nf4, layers-half, prune-2:4, gptq-int4, ...)",
    ),
    train_minutes: float = typer.Option(
        0.0,
        help="Where no EAGLE-3 head for TARGET is stored, train one for this "
        "long as a candidate (at most half the budget; see `train-head`)",
    ),
    name: str | None = typer.Option(None, help="Recipe name for a recommended draft (default: TARGET-draft)"),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the JSON result"),
):
    """Measure every drafter candidate for TARGET on this machine, recommend the fastest, save it for --draft."""
    from .bench import draft_search as ds
    from .make.progress import progress

    _hint()
    search = ds.Search(
        target,
        calibration=calibration,
        prompt_sets=[p for p in prompt_set.split(",") if p],
        budget_minutes=budget_minutes,
        prompts=prompts,
        max_tokens=max_tokens,
        methods=[m for m in methods.split(",") if m],
        train_minutes=train_minutes,
        log=_log,
    )
    search.load()
    path = ds.result_path(out)

    def step(c):  # the result so far is on disk after every candidate, so an interrupted search keeps it
        bar.set_postfix_str(f"{c.name}: {c.status}")
        bar.update()
        ds.write_json(search.result(), path, partial=True)

    with progress(desc="draft-search", unit="step") as bar:
        result = search.search(progress=step)
    saved = ds.save(search, result, name)
    ds.write_json(result, path)
    typer.echo(
        f"target {result.target}: plain decoding {result.plain_tokens_per_s:.2f} tokens/s; "
        f"measured on {', '.join(result.prompts)}\n"
    )
    typer.echo(result.table())
    for note in result.notes:
        typer.echo(f"\nnote: {note}")
    if saved:
        typer.echo(f"\nrecommended: {result.recommended}; use it with: mlx-spec chat --model {target} --draft {saved}")
        for kind, (margin, rival) in result.margins().items():
            typer.echo(f"  on {kind}: {100 * margin:+.0f}% over the best single drafter measured ({rival})")
    typer.echo(f"\nresult: {path}")


def format_stats(s, drafting: bool = True) -> str:
    """Human-readable statistics block (drafting: a drafter ran, so its lines are shown even if it drafted nothing)."""
    lines = [
        "=" * 40,
        f"prompt:     {s.prompt_tokens} tokens ({s.prompt_cached} cached), {s.prompt_tps:.1f} tokens/s",
        f"generation: {s.generation_tokens} tokens, {s.generation_tps:.2f} tokens/s",
        f"memory:     {s.peak_memory_gb:.2f} GB peak above the loaded models",
    ]
    if drafting:
        pos = " ".join(f"{a:.2f}" for a in s.acceptance_by_position())
        lines += [
            f"drafts:     {s.accepted}/{s.proposed} accepted ({100 * s.acceptance_rate:.1f}%), "
            f"{100 * s.draft_share:.1f}% of tokens from drafts",
            f"rounds:     {s.rounds} ({s.spec_rounds} speculative), "
            f"{s.mean_accepted:.2f} accepted per speculative round",
            f"by position: {pos}",
            f"host:       {s.syncs} reads of the device, "
            f"{s.wait_time:.2f} s of {s.generation_time:.2f} s spent waiting",
        ]
    if s.left_out:
        lines.append(f"note:       {s.left_out}")
    if s.fallback:
        lines.append(f"note:       {s.fallback}")
    return "\n".join(lines)


def _mount_bench() -> None:
    from .bench import app as bench_app
    from .server.bench_cli import register

    register(bench_app)  # `bench serve` drives the web app's server, a face above the bench package
    app.add_typer(bench_app, name="bench", help="Benchmarks: speeds as ratios against a baseline in the same run.")


_mount_bench()


def main() -> None:
    """Entry point: one-line errors, no tracebacks, for anything the user can fix."""
    try:
        app()
    except MlxSpecError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
