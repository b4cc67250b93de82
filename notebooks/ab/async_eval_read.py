"""On MLX's CPU device: after `mx.async_eval(t)` and `mx.async_eval(f(t))`, does reading `b`, which `t` was built
from, wait for f(t)? (as the engine reads a round's targets after queueing the next step on its token; BENCHMARKS §37)"""
import time
import mlx_spec  # noqa
import mlx.core as mx
w = mx.random.normal((4096, 4096))
mx.eval(w)
def f(x):
    for _ in range(8):
        x = mx.tanh(w @ x)
    return x
def timed(order):
    x = mx.random.normal((4096, 64))
    mx.eval(x)
    a = f(x)          # the round's logits
    b = a * 2         # what acceptance reads (built on a)
    t = b[:1].astype(mx.float32)  # the token the next step is queued on
    mx.async_eval(t)
    mx.async_eval(f(mx.broadcast_to(t, (4096, 64))))
    s = time.perf_counter()
    mx.eval(b if order == "read b" else t)
    dt = time.perf_counter() - s
    mx.synchronize()
    return dt
for rep in range(3):
    print({o: round(timed(o), 3) for o in ("read t", "read b")}, flush=True)
