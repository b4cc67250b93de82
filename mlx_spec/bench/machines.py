"""Cost profiles of machines (`profiles/*.toml`): a target pass's seconds at each verify size, a plain step, each
costly source's draft step and catch-up token, with where the numbers come from; what a replayed round costs."""

import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MlxSpecError
from ..gen.drafters.base import Draft, Drafter

PROFILES_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class Profile:
    """A machine's costs for one target and its draft model (seconds); noise: the relative spread of each timing."""

    name: str
    machine: str
    source: str  # the record or publication the numbers come from, and how they were derived
    step: float  # a plain step of one row, as the engine runs it (queued ahead)
    verify: dict[int, float]  # a pass over one row's `size` positions
    draft: dict[str, float] = field(default_factory=dict)  # a costly source's draft step
    catch_up: dict[str, float] = field(default_factory=dict)  # a costly source's cost per context token it is fed
    noise: float = 0.0

    def pass_cost(self, size: int) -> float:
        """A pass over `size` positions: measured, else interpolated between the nearest sizes; past the largest,
        its cost plus the mean slope from one position to it (a measured dip past it is not extrapolated)."""
        points = sorted({1: self.step, **self.verify}.items())
        for (s0, c0), (s1, c1) in zip(points, points[1:]):
            if s0 <= size <= s1:
                return c0 + (c1 - c0) * (size - s0) / (s1 - s0)
        (s0, c0), (s1, c1) = points[0], points[-1]
        return c1 + max(0.0, (c1 - c0) / (s1 - s0)) * (size - s1)

    def noisy(self, seconds: float, rng: random.Random) -> float:
        """A timing with the profile's noise: seconds x (1 + noise x N(0, 1)), never below a tenth of it."""
        return seconds * max(0.1, 1 + self.noise * rng.gauss(0.0, 1.0)) if self.noise else seconds


def names() -> list[str]:
    """The profiles that come with mlx-spec."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load(name_or_path: str) -> Profile:
    """A profile by name (`profiles/`) or a .toml file; a bad one is refused in one line."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise MlxSpecError(f"no profile '{name_or_path}' (known: {', '.join(names())}, or a .toml file)")
    data = tomllib.loads(path.read_text())
    try:
        verify = {int(s): float(v) for s, v in data["verify"].items()}
        sources = data.get("sources", {})
        profile = Profile(
            data.get("name", path.stem),
            data["machine"],
            data["source"],
            float(data["step"]),
            verify,
            {s: float(v["draft_step"]) for s, v in sources.items()},
            {s: float(v.get("catch_up", 0.0)) for s, v in sources.items()},
            float(data.get("noise", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise MlxSpecError(
            f"{path}: a profile needs machine, source, step, [verify] and [sources.*] draft_step: {e}"
        ) from None
    if profile.step <= 0 or any(v <= 0 for v in verify.values()) or any(s < 2 for s in verify):
        raise MlxSpecError(f"{path}: every timing must be positive and every verify size at least 2")
    return profile


SIZES = (2, 3, 4, 6, 8, 12, 16)  # the verify sizes a profile times
ROUNDS = 12  # rounds timed a size (the median of those after the first two)


def measure(target: str, draft: str, name: str, log=lambda _m: None) -> Profile:
    """This machine's profile for a target and its draft model, timed as the engine runs its rounds: a plain step
    queued ahead, a round verifying each size (a lookup drafting at a fixed length), the draft model's step (its
    fixed-length rounds less the verify pass they ran), a catch-up token as the draft's prefill of a CONTEXT-token
    prompt."""
    import time

    import mlx.core as mx

    from ..gen.cache import new_cache
    from ..named import load_model, make_drafter
    from .common import cpu_name, median, warm
    from .predict import CONTEXT

    model, tok, _ = load_model(target, log)
    small = load_model(draft, log)[:2]
    prompt = list(range(1, CONTEXT + 1))
    warm(model, (1, CONTEXT, *SIZES))
    step = median(_rounds(model, prompt, None, 0)[2:])
    verify = {s: median(_rounds(model, prompt, _Repeat(), s - 1)[2:]) for s in SIZES}
    drafter = make_drafter(draft, model, tok, loaded={draft: small}, log=log)
    per = [(median(_rounds(model, prompt, drafter, k)[2:]) - verify[k + 1]) / k for k in (3, 7)]
    x = mx.array([prompt])
    mx.eval(small[0](x, cache=new_cache(small[0])))  # warm
    start = time.perf_counter()
    mx.eval(small[0](x, cache=new_cache(small[0])))
    catch_up = (time.perf_counter() - start) / CONTEXT
    return Profile(
        name,
        f"{cpu_name()}, {mx.default_device()}",
        f"measured by `mlx-spec bench profile --target {target} --draft {draft}` (the engine's rounds)",
        step,
        verify,
        {"model": max(0.0, median(per))},
        {"model": catch_up},
    )


class _Repeat(Drafter):
    """A lookup drafting k copies of the context's last token: its rounds cost what any k-token draft's do."""

    name, free = "repeat", True

    def propose(self, context, k, sampler=None) -> Draft:
        return Draft.of([context[-1]] * k, self.name)


def _rounds(model, prompt: list[int], drafter, k: int) -> list[float]:
    """Seconds of each round of the engine drafting k tokens every round (k = 0: plain decoding), ROUNDS + 2 of them."""
    from ..gen.generate import speculative_generate_step
    from ..gen.stats import Stats

    stats = Stats(trace=[])
    steps = speculative_generate_step(
        prompt, model, drafter, max_tokens=(ROUNDS + 2) * (k + 1), num_draft=k or None, adaptive=False, stats=stats
    )
    for _ in steps:
        if len(stats.trace or []) >= ROUNDS + 2:  # a draft accepted or not, a round's cost is its size's
            break
    steps.close()
    return [e["seconds"] for e in stats.trace or [] if not k or e["proposed"] == k]


def to_toml(p: Profile) -> str:
    """The profile as a profiles/*.toml file."""
    verify = "\n".join(f"{s} = {v:.6g}" for s, v in sorted(p.verify.items()))
    sources = "".join(
        f"\n[sources.{s}]\ndraft_step = {v:.6g}\ncatch_up = {p.catch_up.get(s, 0.0):.6g}\n" for s, v in p.draft.items()
    )
    return (
        f'name = "{p.name}"\nmachine = "{p.machine}"\nsource = """{p.source}"""\nstep = {p.step:.6g}\n'
        f"noise = {p.noise}\n\n[verify]\n{verify}\n{sources}"
    )
