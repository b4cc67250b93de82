"""What a learned drafter's decoder layers compute of their config beyond what mlx-lm's classes read: `hidden_act` as
transformers' ACT2FN defines each name, Qwen3's `attention_bias`; and the one-line refusal of what does not run here."""

from collections.abc import Callable, Iterable

import mlx.nn as nn

from ..errors import UnsupportedError

# transformers' ACT2FN names and the mlx function computing each (mlx's gelu_fast_approx is ACT2FN's quick_gelu)
ACTS: dict[str, Callable] = {
    "silu": nn.silu,
    "swish": nn.silu,
    "gelu": nn.gelu,  # the exact GELU, x * Phi(x) by erf
    "gelu_python": nn.gelu,
    "gelu_new": nn.gelu_approx,  # the tanh approximation, under each of its names
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_python_tanh": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,
    "gelu_accurate": nn.gelu_approx,
    "quick_gelu": nn.gelu_fast_approx,  # x * sigmoid(1.702 x)
    "relu": nn.relu,
    "relu2": nn.relu2,
    "relu6": nn.relu6,
    "leaky_relu": nn.leaky_relu,  # slope 0.01, torch's default
    "mish": nn.mish,
    "sigmoid": nn.sigmoid,
    "tanh": nn.tanh,
}


def activation(layer: dict, what: str) -> Callable:
    """The function a layer config's `hidden_act` names (silu where it names none); `what`: the drafter, for the
    one-line refusal of a name not in ACTS."""
    name = layer.get("hidden_act") or "silu"
    if name not in ACTS:
        raise UnsupportedError(f"{what} with hidden_act={name!r} does not run here (it runs {', '.join(ACTS)})")
    return ACTS[name]


def check(layer: dict, what: str) -> None:
    """Refuse in one line what a layer config asks that these layers do not compute: an unknown activation, sliding
    window layers (`layer_types`, or Qwen3's `use_sliding_window` from layer `max_window_layers` on)."""
    activation(layer, what)
    n = int(layer.get("num_hidden_layers") or 1)
    kinds = set(layer.get("layer_types") or ["full_attention"])
    if layer.get("use_sliding_window") and layer.get("sliding_window") and layer.get("max_window_layers", 28) < n:
        kinds.add("sliding_attention")
    if kinds != {"full_attention"}:
        raise UnsupportedError(
            f"{what} with {sorted(kinds - {'full_attention'})} layers does not run here (full attention only)"
        )


class GatedMLP(nn.Module):
    """An mlx-lm MLP's gate, up and down projections (their names and biases kept) with `act` on the gate."""

    def __init__(self, mlp: nn.Module, act: Callable):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act = act

    def __call__(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def honour(blocks: Iterable[nn.Module], layer: dict, what: str) -> None:
    """Make mlx-lm decoder layers built from `layer` compute what it says where their classes do not read it: the
    MLP's activation (mlx-lm's run SiLU) and, for Qwen3 (whose mlx-lm attention has none), `attention_bias`."""
    act = activation(layer, what)
    bias = layer.get("model_type") == "qwen3" and bool(layer.get("attention_bias"))
    for block in blocks:
        if act is not nn.silu:
            block.mlp = GatedMLP(block.mlp, act)
        if bias:
            a = block.self_attn
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out, inp = getattr(a, name).weight.shape
                setattr(a, name, nn.Linear(inp, out, bias=True))
