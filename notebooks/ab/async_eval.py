"""On MLX's CPU device: does `mx.eval(a)` wait for `b = f(a)` queued with `mx.async_eval(b)` (BENCHMARKS §32)?
Times eval(a) three ways: a alone; after async_eval(b); after async_eval(a) then async_eval(b). With `read`: after
async_eval(t) then async_eval(f(t)), reading t or b, which t was built from, as the engine reads a round (§37)."""
import sys
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
def timed_read(order):
    """After async_eval(t) then async_eval(f(t)), t built on b built on a: seconds to read t or b (§37)."""
    x = mx.random.normal((4096, 64))
    mx.eval(x)
    b = f(x) * 2  # what acceptance reads, built on the round's logits
    t = b[:1].astype(mx.float32)  # the token the next step is queued on
    mx.async_eval(t)
    mx.async_eval(f(mx.broadcast_to(t, (4096, 64))))
    s = time.perf_counter()
    mx.eval(b if order == "read b" else t)
    dt = time.perf_counter() - s
    mx.synchronize()
    return dt
for rep in range(3):
    if sys.argv[1:] == ["read"]:
        print({o: round(timed_read(o), 3) for o in ("read t", "read b")}, flush=True)
    else:
        print({o: round(timed(o), 3) for o in ("a alone", "b queued", "a first")}, flush=True)
