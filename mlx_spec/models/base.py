"""What the networks here read of an mlx-lm model: its text model (the submodule that holds its blocks, its embedding,
output layer and config, through a vision-language wrapper), and the bytes of its weights."""

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError

HOLDER_DEPTH = 3  # how deep the blocks may sit: language_model.model (mistral3, llama4 ...), model.language_model


def params_bytes(module) -> int:
    """Bytes of a module's parameters (a model's weights in memory: what decoding reads once a token)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for v in dict(tree_flatten(module.parameters())).values())


def holder_of(model) -> str | None:
    """The path of the submodule whose own list `model.layers` is (`model`, `backbone`, `language_model.model` of a
    vision-language wrapper whose `layers` are properties, `model.language_model` of gemma3n's), or None."""
    import mlx.nn as nn

    ids = [id(b) for b in getattr(model, "layers", None) or ()]
    level = [("", model)] if ids and hasattr(model, "children") else []  # (a wrapper that forwards to a model too)
    for _ in range(HOLDER_DEPTH):
        below = []
        for path, m in level:
            for name, child in m.children().items():
                if isinstance(child, nn.Module):
                    where = f"{path}.{name}" if path else name
                    if isinstance(child.get("layers"), list) and [id(b) for b in child["layers"]] == ids:
                        return where  # an mlx Module is a dict of its own attributes: a list, not a property
                    below.append((where, child))
        level = below
    return None


def holder(model):
    """The submodule that holds `model`'s blocks (see `holder_of`), or None."""
    path = holder_of(model)
    return functools.reduce(getattr, path.split("."), model) if path else None


@dataclass(frozen=True)
class Text:
    """An mlx-lm model's text model as the drafters reach it, a vision-language wrapper's `language_model` included:
    the module holding the blocks (with the embedding and final norm), the text model over it, and its config."""

    model: Any  # the whole mlx-lm model: model(tokens, cache) -> logits; model.layers, the blocks its cache follows
    body: Any  # the submodule whose own list the blocks are (None: `model.layers` is assembled, e.g. afm7's)
    path: str | None  # body's path in `model`: "model", "language_model.model", "model.language_model" ...
    lm: Any  # body's parent, the text model: its lm_head (or the tied embedding) maps body's states to logits
    args: Any  # the text config (vocab_size, hidden_size ...): the deepest on the path to body that has one

    @property
    def blocks(self) -> list:
        """Every block, in the order of the model's cache (mlx-lm's `model.layers`)."""
        return self.model.layers

    @property
    def model_type(self) -> str:
        return getattr(getattr(self.model, "args", None), "model_type", None) or type(self.model).__module__

    @property
    def embed(self):
        """The token embedding (an `nn.Embedding`, maybe quantized), or None where the body has none by that name."""
        return self.body.get("embed_tokens") if self.body is not None else None

    @property
    def head(self):
        """The output layer: the text model's `lm_head`, or the embedding where it is tied (None: neither)."""
        tied = getattr(self.args, "tie_word_embeddings", False)
        return self.lm.get("lm_head") if not tied and "lm_head" in self.lm else self.embed

    @property
    def logits(self):
        """The output layer as a function of states: `head`, or the tied embedding's `as_linear`."""
        import mlx.nn as nn

        head = self.head
        return head.as_linear if isinstance(head, (nn.Embedding, nn.QuantizedEmbedding)) else head

    @property
    def vocab_size(self) -> int:
        """The width of the logits (the padded vocabulary)."""
        v = getattr(self.args, "vocab_size", None)
        if v is not None:
            return v
        if self.embed is not None:
            return self.embed.weight.shape[0]
        import mlx.core as mx  # (a config that names it otherwise, e.g. phixtral's num_vocab): one token's logits

        return self.model(mx.array([[0]])).shape[-1]

    @property
    def hidden_size(self) -> int | None:
        return getattr(self.args, "hidden_size", None)

    def need_body(self, what: str) -> None:
        """Raise, naming `what` cannot run, where the blocks are not one submodule's list."""
        if self.body is None:
            raise UnsupportedError(
                f"{what} is not supported for {self.model_type}: its blocks are not one submodule's list"
            )


def text_of(model) -> Text:
    """Where `model`'s text model keeps its parts (see `Text`)."""
    path = holder_of(model)
    chain = [model]
    for name in path.split(".") if path else ():
        chain.append(getattr(chain[-1], name))
    configs = [getattr(m, "args", None) or getattr(m, "config", None) for m in reversed(chain)]
    args = next((a for a in configs if getattr(a, "vocab_size", None) is not None), getattr(model, "args", None))
    body, lm = (chain[-1], chain[-2]) if path else (None, model)
    return Text(model, body, path, lm, args)
