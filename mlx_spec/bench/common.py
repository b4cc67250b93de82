"""What every benchmark shares: machine facts, timing a token stream, run files and markdown tables."""

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import blas, device
from ..models.base import params_bytes

DEFAULT_OUT = "runs"  # one JSON + one markdown file per run land here
WITHIN = 0.05  # "ours matches mlx-lm" means a speed ratio within 5% of 1


def git_revision() -> str | None:
    """The code's git revision ("-dirty" when the package differs from it); outside a git checkout (a copy of the
    tree on another machine) MLX_SPEC_REVISION if set, else None."""
    if os.environ.get("MLX_SPEC_REVISION"):
        return os.environ["MLX_SPEC_REVISION"]
    try:
        here = Path(__file__).parent
        rev = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", str(here.parent)],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if rev and dirty:
            rev += "-dirty"  # the package's code differs from that revision: the numbers are not its
        return rev
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    """Facts that change the numbers: cores, BLAS under MLX, the GPU and its driver, library versions, code revision."""

    import mlx.core as mx
    import mlx_lm

    from ..version import __version__

    rev, dev = git_revision(), device.info()
    return {
        "cpu": cpu_name(),
        "memory_gb": memory_gb(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "blas_status": blas.status,
        "blas_path": blas.path,
        "blas_env": os.environ.get(blas.ENV_VAR),
        "mlx": mx.__version__,  # type: ignore[attr-defined]  # mlx's stubs leave it out
        "mlx_lm": mlx_lm.__version__,
        "mlx_spec": __version__,
        "mlx_device": str(mx.default_device()),
        "mlx_backend": dev.backend,  # metal, cuda or cpu
        "gpu": dev.name if dev.kind == "gpu" else None,
        "gpu_driver": dev.driver,  # the NVIDIA driver's version on CUDA
        "cudnn_sdpa": os.environ.get("MLX_CUDA_USE_CUDNN_SDPA"),  # mlx_spec.backend turns it off unless set
        "git_rev": rev,
        "loadavg_start": os.getloadavg(),  # other work on the machine skews every timing
    }


def cpu_name() -> str:
    """The chip or CPU model: 'Apple M3 Max' on a Mac, the /proc/cpuinfo model name on Linux."""
    if sys.platform == "darwin":
        try:
            return (
                subprocess.run(
                    ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=10
                ).stdout.strip()
                or platform.processor()
            )
        except (OSError, subprocess.SubprocessError):
            return platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> float | None:
    """Physical memory in GB (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def folder_sha256(folder) -> str:
    """One sha256 over a model folder's weight files, in name order: which weights were measured."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- timing a token stream


@dataclass
class Timing:
    """One timed generation. The clock starts before the generator is made (so prefill counts)."""

    tokens: list[int]
    from_draft: list[bool]
    ttft: float  # start -> first token: prefill plus the first decode step
    total: float  # start -> last token
    peak_memory_gb: float  # MLX's peak allocation during the run: every loaded model's weights included
    active_before_gb: float  # allocated when the run started (the loaded weights)
    finish: str  # "stop" (EOS) or "length"

    @property
    def peak_extra_gb(self) -> float:
        """Peak memory the generation itself added: KV caches, activations, scratch."""
        return self.peak_memory_gb - self.active_before_gb

    @property
    def decode_time(self) -> float:
        return self.total - self.ttft

    @property
    def decode_tps(self) -> float:
        """Tokens after the first per second of decoding (mlx-lm's convention)."""
        n = len(self.tokens) - 1
        return n / self.decode_time if n > 0 and self.decode_time > 0 else 0.0

    @property
    def e2e_tps(self) -> float:
        """All generated tokens over the whole time, prefill included."""
        return len(self.tokens) / self.total if self.total > 0 else 0.0

    def as_dict(self, with_tokens: bool = True) -> dict:
        d = asdict(self)
        if not with_tokens:
            d.pop("tokens")
            d.pop("from_draft")
        d.update(
            n_tokens=len(self.tokens),
            decode_time=self.decode_time,
            decode_tps=self.decode_tps,
            e2e_tps=self.e2e_tps,
            n_from_draft=sum(self.from_draft),
            peak_extra_gb=self.peak_extra_gb,
        )
        return d


def time_stream(make: Callable[[], Iterable[tuple]], max_tokens: int, eos: Sequence[int] = ()) -> Timing:
    """Run a (token, from_draft) generator to `max_tokens` or an EOS token (kept), timing it."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory() / 1e9
    stops = set(eos)
    tokens, flags, ttft, finish = [], [], 0.0, "length"
    start = time.perf_counter()
    gen = make()
    for step in gen:  # (token, from_draft, ...) tuples: our Step, or the mlx-lm adapters below
        tok = step[0]
        tokens.append(int(tok))
        flags.append(bool(step[1]))
        if len(tokens) == 1:
            ttft = time.perf_counter() - start
        if tok in stops:
            finish = "stop"
            break
        if len(tokens) >= max_tokens:
            break
    total = time.perf_counter() - start
    if hasattr(gen, "close"):
        gen.close()  # run the generator's cleanup (mlx-lm's speculative step rewinds its caches)
    return Timing(tokens, flags, ttft, total, mx.get_peak_memory() / 1e9, before, finish)


def warm(model, sizes: Iterable[int] | None = None) -> None:
    """Build `model`'s kernels for passes of each size (default: every size the engine pads to, as a verify, a
    catch-up or a prompt's last chunk runs) on a scratch cache, so that no timing includes a build; where the device
    does not build per shape, this does nothing."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..gen.shapes import first_time, padded
    from ..gen.tunables import PREFILL_STEP

    if not device.builds_per_shape():
        return
    sizes = sorted({padded(n) for n in range(1, PREFILL_STEP + 1)}) if sizes is None else sizes
    cache = make_prompt_cache(model)
    for size in sizes:
        mx.eval(model(mx.zeros((1, size), dtype=mx.uint32), cache=cache))
        for c in cache:
            c.trim(size)
        first_time(model, size)  # the engine does not take this shape's next pass for a build


def ours_stream(prompt: list[int], model, drafter=None, stats=None, **kwargs) -> Iterator[tuple]:
    """Our engine's (token, from_draft) stream."""
    from ..gen.generate import speculative_generate_step

    return speculative_generate_step(prompt, model, drafter, stats=stats, **kwargs)


def mlx_lm_stream(prompt: list[int], model, max_tokens: int) -> Iterator[tuple]:
    """mlx-lm's plain `generate_step`, greedy. It never stops at EOS itself (its `stream_generate` does)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    for tok, _logprobs in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        yield tok, False


def mlx_lm_spec_stream(prompt: list[int], model, draft, max_tokens: int, k: int) -> Iterator[tuple]:
    """mlx-lm's `speculative_generate_step` with a draft model, greedy, k draft tokens per round."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    gen = speculative_generate_step(mx.array(prompt), model, draft, num_draft_tokens=k, max_tokens=max_tokens)
    try:
        for tok, _logprobs, from_draft in gen:
            yield tok, from_draft
    finally:
        gen.close()


def rounds_from_flags(flags: Sequence[bool], k: int, max_tokens: int) -> dict:
    """Acceptance of a fixed-k speculative run, rebuilt from its from_draft flags (mlx-lm reports no more).

    Each round yields its accepted drafts (True) then the target's token (False); a round
    proposes min(k, tokens still allowed). A run cut short at EOS counts its last round's
    unseen drafts as rejected.
    """
    proposed_by_pos, accepted_by_pos = [0] * k, [0] * k
    produced, run, rounds = 0, 0, 0
    for i, f in enumerate(flags):
        if f:
            run += 1
            if i < len(flags) - 1:
                continue
        n = min(k, max_tokens - produced)
        for p in range(n):
            proposed_by_pos[p] += 1
            accepted_by_pos[p] += p < run
        produced += run + (0 if f else 1)
        rounds += 1
        run = 0
    proposed, accepted = sum(proposed_by_pos), sum(accepted_by_pos)
    return {
        "rounds": rounds,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "mean_accepted": accepted / rounds if rounds else 0.0,
        "draft_share": sum(flags) / len(flags) if flags else 0.0,
        "proposed_by_position": proposed_by_pos,
        "accepted_by_position": accepted_by_pos,
        "acceptance_by_position": [a / p if p else 0.0 for a, p in zip(accepted_by_pos, proposed_by_pos)],
        "reconstructed": True,
    }


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def params_gb(model) -> float:
    """Bytes of a model's parameters (its weights in memory), in GB."""
    return params_bytes(model) / 1e9


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def free() -> None:
    """Collect dropped models and return MLX's cached buffers (callers `del` their references first)."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


# --------------------------------------------------------------------------- run files


@dataclass
class RunFile:
    """One run's JSON (rewritten whole after each step, so a stopped run keeps its data) and markdown."""

    kind: str
    out: Path
    data: dict = field(default_factory=dict)

    def __post_init__(self):
        self.out = Path(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.json_path = self.out / f"{self.kind}-{stamp}-{os.getpid()}.json"
        self.md_path = self.json_path.with_suffix(".md")
        self.data = {
            "kind": self.kind,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": _command(),
            "complete": False,
            **self.data,
        }

    def flush(self) -> None:
        """Rewrite the JSON whole, atomically."""
        self.data["machine"]["loadavg_end"] = os.getloadavg()
        tmp = self.json_path.with_name("." + self.json_path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.json_path)

    def write_markdown(self, text: str) -> None:
        self.md_path.write_text(text)


def _command() -> list:
    """This process's command line as the user would retype it."""
    head = Path(sys.argv[0])
    if head.name == "__main__.py":  # python -m <package>
        return ["python", "-m", __package__, *sys.argv[1:]]
    return [head.name, *sys.argv[1:]]


def md_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub markdown table."""

    def cell(x):
        return f"{x:.2f}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def page_head(data: dict) -> str:
    """The first lines of a suite's page: its name, description, command and machine."""
    s = data["suite"]
    return (
        f"# Benchmark suite `{s['name']}`\n\n{s['description']}\n\n`{' '.join(data['command'])}`\n\n"
        f"- machine: {machine_line(data['machine'])}\n"
    )


def machine_line(m: dict) -> str:
    """One line of machine facts for the top of a markdown report."""
    return (
        f"{m.get('cpu') or m['machine']}, {m['cpu_count']} CPUs ({m['machine']}), "
        + (f"{m['memory_gb']:.0f} GB memory, " if m.get("memory_gb") else "")
        + f"BLAS {m['blas_status']}"
        f"{' ' + m['blas_path'] if m.get('blas_path') else ''}, MLX {m['mlx']} ({m['mlx_device']}{_gpu(m)}), "
        f"mlx-lm {m['mlx_lm']}, mlx-spec {m['mlx_spec']} @ {m['git_rev']}; load average at start "
        f"{m['loadavg_start'][0]:.2f}, at the last write {m.get('loadavg_end', [float('nan')])[0]:.2f}"
    )


def _gpu(m: dict) -> str:
    """', CUDA NVIDIA H100 80GB HBM3, driver 580.159.04' for a run on a GPU; '' on the CPU and in older records."""
    if not m.get("gpu"):
        return ""
    driver = f", driver {m['gpu_driver']}" if m.get("gpu_driver") else ""
    backend = device.BACKENDS.get(m.get("mlx_backend", ""), m.get("mlx_backend"))
    return f", {backend + ' ' if backend else ''}{m['gpu']}{driver}"
