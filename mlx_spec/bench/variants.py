"""`MODEL@METHOD`: a model shrunk by one of `convert`'s draft methods, converted once into the cache.

The methods are `mlx_spec.make.convert.draft_methods()` (float16, int4, layers-half, ...): suites name
them, they never list them.
"""

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

from ..errors import MlxSpecError

Log = Callable[[str], None]


def all_float32(folder: Path) -> bool:
    """Whether every tensor in the folder's safetensors is F32 (read from the headers, not the names)."""
    files = sorted(folder.glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        if any(v.get("dtype") != "F32" for k, v in header.items() if k != "__metadata__"):
            return False
    return bool(files)


def methods() -> dict:
    from ..make.convert import draft_methods

    return draft_methods()


def variant_folder(spec: str, method: str, log: Log = lambda _m: None) -> Path:
    """The folder of `spec` shrunk by `method`: the source itself when it already is that, else a cached conversion."""
    from ..make.resolve import convert, resolve

    options = dict(methods().get(method) or {})
    if not options:
        raise MlxSpecError(f"unknown method '{method}' (one of {', '.join(methods())})")
    src = resolve(spec, log)
    if options == {"dtype": "float32"} and all_float32(src):
        return src
    fraction = options.pop("keep_fraction", None)
    if fraction is not None:
        cfg = json.loads((src / "config.json").read_text())
        n = cfg.get("num_hidden_layers") or cfg.get("text_config", {}).get("num_hidden_layers")
        if not n:
            raise MlxSpecError(f"{spec}: its config says no num_hidden_layers, so '{method}' has no layer count")
        options["keep_layers"] = max(1, round(n * fraction))
    out = _variant_path(spec, src, method)
    if not (out / "config.json").is_file():
        log(f"converting {spec} to {method} into {out}")
        convert(str(src), out, force=out.exists(), log=log, **options)
    return out


def _variant_path(spec: str, src: Path, method: str) -> Path:
    from ..make.paths import home
    from ..make.recipes import find

    base = spec if find(spec) else f"{src.name}-{hashlib.sha1(str(src.resolve()).encode()).hexdigest()[:8]}"
    return home() / "bench" / "variants" / f"{base}-{method.replace(':', '-')}"


def cached_variant(folder: str, method: str) -> Path | None:
    """The cached conversion of the model folder `folder` by `method`, if one was made already."""
    out = _variant_path(folder, Path(folder), method)
    return out if (out / "config.json").is_file() else None
