"""The rotary settings of a config: transformers 5's `rope_parameters` folded into the top-level `rope_theta` and
`rope_scaling` that mlx-lm's models read, or a one-line refusal where mlx-lm cannot run them."""

import importlib
from dataclasses import fields

from ..errors import UnsupportedError

# The rope types mlx-lm's `rope_utils.initialize_rope` builds (any other raises there or is ignored)
IMPLEMENTED = ("default", "linear", "dynamic", "llama3", "yarn", "deepseek_yarn", "telechat3-yarn", "longrope",
               "proportional", "mrope")  # fmt: skip
# Model types whose sliding layers take their own theta from a key of their own (transformers 5 nests it per layer type)
LOCAL_THETA = {"gemma3_text": "rope_local_base_freq"}
FOLDED = ("rope_theta", "partial_rotary_factor")  # what moves from rope_parameters to the top level as is


def normalize(config: dict, model_type: str | None = None) -> dict:
    """A copy of `config` (model_type: mlx-lm's architecture, else the config's) with the settings of its
    `rope_parameters` also at the top-level keys mlx-lm reads; an UnsupportedError names the key and value that
    conflict with the top level or that mlx-lm's architecture does not run."""
    c = dict(config)
    if isinstance(c.get("text_config"), dict):  # a vision-language wrapper's text model
        c["text_config"] = normalize(c["text_config"])
    kind = model_type or c.get("model_type")
    arch = _arch(kind)
    known = {f.name for f in fields(arch.ModelArgs)} if arch else None
    params, origin = c.get("rope_parameters"), "rope_scaling"
    if isinstance(params, dict) and params:
        if all(isinstance(v, dict) for v in params.values()):  # per layer type
            if known is not None and "rope_parameters" in known:
                return c  # the architecture reads them itself
            if kind not in LOCAL_THETA or set(params) - {"full_attention", "sliding_attention"}:
                raise UnsupportedError(
                    f"rope_parameters: settings per layer type ({', '.join(params)}) that mlx-lm's {kind} does not read"
                )
            local = params.get("sliding_attention") or {}
            if _type(local) != "default":
                raise UnsupportedError(
                    f"rope_parameters.sliding_attention.rope_type={_type(local)!r}: mlx-lm's {kind} scales no "
                    "sliding layer"
                )
            if "rope_theta" in local:
                _set(c, LOCAL_THETA[kind], local["rope_theta"], "rope_parameters.sliding_attention.rope_theta")
            params, where = params.get("full_attention") or {}, "rope_parameters.full_attention"
        else:
            where = "rope_parameters"
        for key in FOLDED:
            if params.get(key) is not None:
                _set(c, key, params[key], f"{where}.{key}")
        given = {k: v for k, v in params.items() if k != "rope_theta"}
        scaling = given if _type(given) != "default" else None
        if _plain(c.get("rope_scaling")) != _plain(scaling):
            if c.get("rope_scaling") is not None:
                raise UnsupportedError(
                    f"{where}.rope_type={_type(params)!r} conflicts with rope_scaling={c['rope_scaling']!r}"
                )
            c["rope_scaling"], origin = scaling, where
    _check(c.get("rope_scaling"), origin, kind, arch)
    return c


def overrides(config: dict, model_type: str | None = None) -> dict:
    """The keys `normalize` sets or changes in `config`: what to hand mlx-lm's loader as its `model_config`."""
    new = normalize(config, model_type)
    return {k: v for k, v in new.items() if k not in config or config[k] != v}


def _set(c: dict, key: str, value, where: str) -> None:
    if c.get(key) is not None and c[key] != value:
        raise UnsupportedError(f"{where}={value!r} conflicts with {key}={c[key]!r}")
    c[key] = value


def _type(scaling: dict | None) -> str:
    return (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"


def _plain(scaling: dict | None) -> dict | None:
    """A scaling config as compared: its type under one key, the theta left out, no scaling as None."""
    if not scaling or _type(scaling) == "default":
        return None
    skip = ("type", "rope_type", "rope_theta", *FOLDED)
    return {k: v for k, v in scaling.items() if k not in skip} | {"type": _type(scaling)}


def _check(scaling: dict | None, origin: str, kind: str | None, arch) -> None:
    """Refuse a scaling that mlx-lm's architecture would drop or fail on (an unknown architecture: mlx-lm says)."""
    t = _type(scaling)
    if scaling is None or t == "default" or arch is None:
        return
    key = f"{origin}.rope_type" if "rope_type" in scaling else f"{origin}.type"
    if not {"rope_scaling", "rope_parameters"} & {f.name for f in fields(arch.ModelArgs)}:
        raise UnsupportedError(f"{key}={t!r}: mlx-lm's {kind} applies no rope scaling")
    if hasattr(arch, "initialize_rope") and t not in IMPLEMENTED:  # (others, e.g. phi3, read their own types)
        raise UnsupportedError(f"{key}={t!r}: mlx-lm's {kind} runs the rope types {', '.join(IMPLEMENTED)}")


def _arch(kind: str | None):
    """mlx-lm's module of a model type, or None where it has none."""
    if not kind:
        return None
    from mlx_lm.utils import MODEL_REMAPPING

    try:
        return importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(kind, kind)}")
    except ImportError:
        return None
