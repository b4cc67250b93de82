"""The planner's own time per round, a row that may draft trees against one that may not (run from the repository
root: python notebooks/ab/plan_cost.py; it reuses tests/test_tree.py's timed planner)."""
import sys, time; sys.path.insert(0, "tests")
import mlx_spec
from test_tree import _planner
from mlx_spec.gen.acceptance import SourceStats
from mlx_spec.gen.planner import Ask
sizes = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
for tree in (False, True, False, True):
    p = _planner({s: 0.170 + 0.009 * s for s in sizes}, 0.005)
    st = SourceStats()
    for _ in range(40): st.observe(1, 0)
    ask = Ask({"eagle3": st}, costly="eagle3", cap=15, left=100, tree=tree)
    t = time.perf_counter()
    for _ in range(2000): p.plan([ask], pad=True)
    print(tree, f"{(time.perf_counter() - t) / 2000 * 1e6:.0f} us per plan")
