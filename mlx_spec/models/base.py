"""What the networks here read of an mlx-lm model: the submodule that holds its blocks (and its embedding and norm),
and the bytes of its weights."""

import functools


def params_bytes(module) -> int:
    """Bytes of a module's parameters (a model's weights in memory: what decoding reads once a token)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for v in dict(tree_flatten(module.parameters())).values())


def holder_of(model) -> str | None:
    """The path of the submodule whose own list `model.layers` is (`model`, `backbone`, `language_model.model` of a
    vision-language wrapper whose `layers` are properties), or None."""
    ids = [id(b) for b in getattr(model, "layers", None) or ()]
    children = model.children().items() if ids and hasattr(model, "children") else ()
    for name, child in children:
        if [id(b) for b in getattr(child, "layers", None) or ()] == ids:
            if "layers" in child:  # an mlx Module is a dict of its own attributes: a list, not a property
                return name
            deeper = holder_of(child)
            return f"{name}.{deeper}" if deeper else None
    return None


def holder(model):
    """The submodule that holds `model`'s blocks (see `holder_of`), or None."""
    path = holder_of(model)
    return functools.reduce(getattr, path.split("."), model) if path else None
