"""On MLX's CPU device: does `mx.eval(a)` wait for `b = f(a)` queued with `mx.async_eval(b)` (BENCHMARKS §32)?
Times eval(a) three ways: a alone; after async_eval(b); after async_eval(a) then async_eval(b)."""
import time
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
    a = f(x)
    if order == "a first":
        mx.async_eval(a)
    if order != "a alone":
        mx.async_eval(f(a))
    t = time.perf_counter()
    mx.eval(a)
    dt = time.perf_counter() - t
    mx.synchronize()
    return dt
for rep in range(3):
    print({o: round(timed(o), 3) for o in ("a alone", "b queued", "a first")}, flush=True)
