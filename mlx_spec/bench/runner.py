"""`mlx-spec bench run SUITE`: a suite into a result file, new or resumed; and `bench list`."""

from collections.abc import Callable

from . import roofline, table
from . import suite as suites
from .common import machine_info
from .results import ResultFile

Log = Callable[[str], None]
# suite kinds whose runs need a face above the bench, by kind: `agent` (mlx_spec/server/bench_cli.py registers it with
# its server)
FACES: dict[str, Callable[..., ResultFile]] = {}


def listing() -> list[tuple[str, str, str]]:
    """(name, kind, description) of every built-in suite."""
    from . import agent

    out = []
    for path in suites.builtin():
        s = agent.load(str(path)) if agent.is_agent(str(path)) else suites.load(str(path))
        out.append((s.name, s.kind, s.description))
    return out


def run_suite(
    name_or_path: str,
    out: str,
    resume: str | None = None,
    log: Log = lambda _m: None,
    model: str | None = None,
    head: str | None = None,
) -> ResultFile:
    """Run (or resume) a suite; the result file is written after every measurement and returned at the end.
    model: run the suite's rows on this target instead of the suite's own (every target's drafts, once each);
    head: the head folder a suite naming HEAD measures."""
    from . import agent
    from . import head as heads

    if agent.is_agent(name_or_path):
        if "agent" not in FACES:
            raise suites.SuiteError("an agent suite drives the server: run it with `mlx-spec bench run`")
        return FACES["agent"](name_or_path, out, resume=resume, log=log, model=model)
    s = suites.load(name_or_path)
    if s.kind == "cluster":  # every rank runs it, each writing its own file: no resuming
        from . import cluster

        if resume:
            raise suites.SuiteError("a cluster suite cannot be resumed: run it again")
        if model is not None:
            s.targets = suites.retarget(s.targets, model)
        return cluster.run(s, out, log)
    training = heads.point(s, head)
    if model is not None:
        s.targets = suites.retarget(s.targets, model)
    if resume:
        result = ResultFile.resume(resume, s.as_dict())
        log(f"resuming {result.path}: {len(result.done)} measurements already done")
    else:
        result = ResultFile.create(out, s.as_dict(), machine_info())
        log(f"writing {result.path}")
    if training is not None:
        result.data["training"] = training
    if s.kind == "roofline" and "bandwidth" not in result.data:
        log("measuring the memory read bandwidth")
        result.data["bandwidth"] = roofline.measure_bandwidth(s.bandwidth_gb)
        result.flush()
    try:
        if s.kind == "predict":
            from . import predict

            predict.run(s, result, log)
            result.publish(table.render)
            return result
        table.TableRun(s, result, log).run()
    except KeyboardInterrupt:
        log(f"interrupted: what was measured is in {result.path}; continue with --resume {result.path}")
        raise
    return result
