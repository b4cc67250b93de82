"""Running a suite: per target, its rows (the target alone first, then each draft) on every prompt.

Every kind runs here; what differs is where the rows come from (`Suite.rows`: the drafts listed, an
n-gram K x N sweep, convert's methods, a sampling grid) and how the result is summarized and shown
(the M3 Max table, plus roofline.py, grids.py, quality.py). Each row runs every prompt, repeat after
repeat, in an order rotated per prompt so the machine's noise falls on all rows, after one untimed
warm-up. Each measurement is appended to the result file as it finishes; a resumed run skips the
ones it has. A target or draft that cannot be fetched or loaded marks its rows unavailable, with
why, and the rest goes on.
"""

import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MlxSpecError
from ..make.progress import progress
from . import grids
from .common import (
    first_mismatch,
    folder_sha256,
    free,
    median,
    mlx_lm_spec_stream,
    mlx_lm_stream,
    ours_stream,
    params_gb,
    rounds_from_flags,
    time_stream,
    warm,
)
from .prompts import WARMUP_PROMPT, build, chat_ids
from .report import M3MAX_COLUMNS, _acceptance, aligned_table, improvement
from .results import ResultFile, key
from .suite import ModelRef, Suite

Log = Callable[[str], None]
WARMUP_TOKENS = 8
MLX_LM_SPEC = "mlx-lm-spec:"  # a draft row run by mlx-lm's own speculative_generate_step with this draft model
MLX_LM = "mlx-lm"  # a row run by mlx-lm's own plain generate_step: the loop every engine is measured against
MLX_LM_K = 3  # its num_draft_tokens unless the row sets K: its fastest fixed K for the Qwen pair here


class MlxLmSpec:
    """A row's "drafter" that is mlx-lm's speculative decoding with a draft model (the baseline to beat); with no
    model, mlx-lm's plain decoding."""

    def __init__(self, model=None):
        self.model = model


def folder_of(ref: ModelRef, log: Log) -> Path:
    """The folder a suite's model name means: fetched and converted as `generate` would, then quantized if asked."""
    from ..make.resolve import resolve
    from .variants import variant_folder

    return resolve(ref.spec, log) if ref.quant is None else variant_folder(ref.spec, ref.quant, log)


def draft_folder_spec(draft: str, log: Log):
    """(the drafter spec `make_drafter` takes, the folder of its model or None): MODEL@QUANT becomes a folder."""
    from ..gen import registry

    if draft.startswith(MLX_LM_SPEC):
        folder = folder_of(ModelRef.parse(draft.removeprefix(MLX_LM_SPEC), f"draft '{draft}'"), log)
        return draft, folder
    s = registry.parse(draft)
    if s.kind == "model" or (s.kind == "hybrid" and s.arg and registry.parse(s.arg).kind == "model"):
        folder = folder_of(ModelRef.parse(s.arg, f"draft '{draft}'"), log)
        return (f"hybrid:{folder}" if s.kind == "hybrid" else str(folder)), folder
    return draft, None


def spec_model(draft: str) -> str:
    """The MODEL[@QUANT] part of a model, hybrid or mlx-lm-spec draft spec."""
    return draft.removeprefix("hybrid:").removeprefix(MLX_LM_SPEC)


class TableRun:
    """One run of a suite into a result file."""

    def __init__(self, suite: Suite, result: ResultFile, log: Log = lambda _m: None):
        self.suite, self.result, self.log = suite, result, log
        self.per_row = suite.repeats * sum(suite.prompts.values())
        total = sum(len(suite.rows(t)) + (suite.kind != "quality") for t in suite.targets) * self.per_row
        self.bar = progress(total=total, initial=len(result.done), desc=f"bench {suite.name}", unit="gen")

    def run(self) -> None:
        try:
            for t in self.suite.targets:
                self.target(t)
            self.result.data["complete"] = True
        finally:
            self.bar.close()
            self.publish()

    def publish(self) -> str:
        return self.result.publish(render)

    def _row(
        self,
        target: str,
        draft: str | None,
        k: int | None = None,
        temp: float | None = None,
        top_k: int | None = None,
        planner: str = "",
        **labels,
    ) -> dict:
        label = draft or "none"
        if k is not None:
            label += f" K={k}" + (f" {planner}" if planner else "")
        if temp is not None:
            label += f" temp={temp} top_k={top_k}"
        row = {
            "key": key(target, label),
            "target": target,
            "draft": draft or "none",
            "k": k,
            "temp": temp,
            "top_k": top_k,
            **({"planner": planner} if planner else {}),
            **labels,
        }
        self.result.set_row(row)
        return row

    def _unavailable(self, row: dict, e: BaseException) -> None:
        row.update(status="unavailable", reason=str(e).splitlines()[0] if str(e) else type(e).__name__)
        self.result.set_row(row)
        self.bar.update(self.per_row - len(self.result.records(row["key"])))  # nothing to wait for on this row
        self.log(f"{row['target']} / {row['draft']}: unavailable: {row['reason']}")
        self.result.flush()

    def target(self, t) -> None:  # noqa: C901  # one target's rows in order: load, each drafter, each prompt
        from ..gen.load import check_tokenizers
        from ..gen.planner import Planner
        from ..named import draft_model, load_model, make_drafter, quantization

        s = self.suite
        name = str(t.model)
        rows = [self._row(name, None, draft_quant="N/A", status="ok")] if s.kind != "quality" else []
        rows += [self._row(name, **r, status="ok") for r in s.rows(t)]
        try:
            folder = folder_of(t.model, self.log)
            model, tok, _ = load_model(str(folder), self.log)
            warm(model)
        except (MlxSpecError, OSError, ValueError) as e:
            for row in rows:
                self._unavailable(row, e)
            return
        from .roofline import bytes_per_token

        self.result.data["models"][name] = {
            "folder": str(folder),
            "weights_gb": params_gb(model),
            "read_gb": bytes_per_token(model) / 1e9,
            "quantization": quantization(model),
            "sha256": folder_sha256(folder),
        }
        for row in rows:
            row["target_quant"] = quantization(model)
        prompts = build(
            tok,
            s.prompts["humaneval"],
            s.prompts["edit"],
            n_prose=s.prompts["prose"],
            n_prefix=s.prompts["prefix"],
            n_ptq=s.prompts["ptq"],
        )
        eos = tuple(tok.eos_token_ids)
        # row key -> (drafter, K, (its planner, its acceptance) or None for mlx-lm's own)
        drafters: dict[str, tuple[Any, int | None, tuple | None]] = {}
        loaded: dict[str, tuple] = {}  # draft folder -> (model, tokenizer): one copy serves every row using it
        for row in rows:
            if row["draft"] == "none":
                drafters[row["key"]] = (None, None, (Planner(), {}))
                continue
            if row["draft"] == MLX_LM:
                drafters[row["key"]] = (MlxLmSpec(), None, None)
                row["draft_quant"] = "N/A"
                continue
            try:
                spec, dfolder = draft_folder_spec(row["draft"], self.log)
                if dfolder is not None and str(dfolder) not in loaded:
                    dmodel, dtok, _ = load_model(str(dfolder), self.log)
                    check_tokenizers(tok, dtok)
                    warm(dmodel)
                    loaded[str(dfolder)] = (dmodel, dtok)
                    self.result.data["models"][spec_model(row["draft"])] = {
                        "folder": str(dfolder),
                        "weights_gb": params_gb(dmodel),
                        "quantization": quantization(dmodel),
                        "sha256": folder_sha256(dfolder),
                    }
                k = row["k"] or s.num_draft
                if spec.startswith(MLX_LM_SPEC):
                    drafters[row["key"]] = (MlxLmSpec(loaded[str(dfolder)][0]), row["k"] or MLX_LM_K, None)
                    row["draft_quant"] = quantization(loaded[str(dfolder)][0])
                    continue
                drafter = make_drafter(spec, model, tok, loaded=loaded, log=self.log)
                row["draft_quant"] = quantization(draft_model(drafter, model))
                # One planner and acceptance a row, kept across its prompts as a session keeps them across turns.
                mode = row.get("planner", "")
                planner = Planner(s.adaptive and mode != "fixed", only_k=(k or 0) if mode == "onoff" else 0)
                drafters[row["key"]] = (drafter, k, (planner, {}))
            except (MlxSpecError, OSError, ValueError) as e:
                self._unavailable(row, e)
        for row in rows:
            if row["key"] in drafters:
                self.result.set_row(row)
                self._generate(model, *drafters[row["key"]], row, chat_ids(tok, WARMUP_PROMPT), WARMUP_TOKENS, eos)
        self.result.flush()
        live = [r for r in rows if r["key"] in drafters]
        for rep in range(s.repeats):
            for i, p in enumerate(prompts):
                shift = (rep * len(prompts) + i) % len(live)
                for row in live[shift:] + live[:shift]:
                    k = key(row["key"], p.id, rep)
                    if k in self.result.done:
                        continue
                    rec = self._measure(model, *drafters[row["key"]], row, p, rep, eos)
                    if s.kind == "quality":
                        from .quality import duplicate_content_words

                        rec["text"] = tok.decode(rec["tokens"])
                        rec["duplicate_content_words"] = duplicate_content_words(rec["text"])
                    rec.update(key=k, row=row["key"])
                    self.result.add(rec)
                    self.bar.update(1)
                self.publish()
        drafters.clear()
        del model
        free()

    def _generate(self, model, drafter, k, planner, row: dict, ids, max_tokens: int, eos, stats=None):
        s = self.suite
        temp = s.temp if row.get("temp") is None else row["temp"]  # a quality row samples its own way
        top_k = s.top_k if row.get("top_k") is None else row["top_k"]
        if isinstance(drafter, MlxLmSpec) and drafter.model is None:
            return time_stream(lambda: mlx_lm_stream(ids, model, max_tokens), max_tokens, eos)
        if isinstance(drafter, MlxLmSpec):  # greedy only (the suite checks): mlx-lm reports flags, not stats
            t = time_stream(lambda: mlx_lm_spec_stream(ids, model, drafter.model, max_tokens, k), max_tokens, eos)
            if stats is not None:
                stats.__dict__.update(
                    {
                        key: v
                        for key, v in rounds_from_flags(t.from_draft, k, max_tokens).items()
                        if key in stats.__dict__
                    }
                )
                stats.spec_rounds = stats.rounds
            return t
        return time_stream(
            lambda: ours_stream(
                ids,
                model,
                drafter,
                stats=stats,
                max_tokens=max_tokens,
                eos_token_ids=eos,
                temp=temp,
                top_p=s.top_p,
                top_k=top_k,
                planner=planner[0],
                accept=planner[1],
                num_draft=k,
            ),
            max_tokens,
            eos,
        )

    def _measure(self, model, drafter, k, planner, row: dict, p, rep: int, eos) -> dict:
        import mlx.core as mx

        from ..gen.stats import Stats

        stats = Stats(trace=[])  # every round's choice and cost, kept: the planner is judged on them afterwards
        mx.random.seed(zlib.crc32(f"{p.id}|{rep}".encode()))  # sampling: the same seed for every row
        t = self._generate(model, drafter, k, planner, row, p.ids, self.suite.max_tokens, eos, stats)
        d = stats.as_dict()
        d["trace"] = compact_trace(d["trace"])
        return {
            "prompt": p.id,
            "set": p.set,
            "repeat": rep,
            "prompt_tokens": len(p.ids),
            **t.as_dict(),
            "stats": d,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "loadavg": os.getloadavg()[0],
        }  # other work beside a measurement slows it: 1-minute load at its end


TRACE_FIELDS = ("source", "proposed", "accepted", "seconds", "size", "behind")  # then hindsight [matched, judged]


def compact_trace(trace: list[dict] | None) -> list[list] | None:
    """The engine's per-round trace as one short row a round (TRACE_FIELDS, then the hindsight pair if any)."""
    return [
        [r[f] if f != "seconds" else round(r[f], 5) for f in TRACE_FIELDS] + r.get("hindsight", []) for r in trace or []
    ] or None


def rounds(records: list[dict]) -> dict:
    """What a row's rounds cost, pooled over its records: per round, the wall clock (ms), the host's part of it
    (ms not spent waiting on the device), reads of the device, tokens; and the decode tokens/s its tokens per round
    and warm round costs predict: each round at the median time of its kind (source, verify size, drafted tokens) in
    the row, so first-seen shapes and stalls fall out; a round that caught a draft model up counts as measured."""
    ok = [r for r in records if (r.get("stats") or {}).get("trace")]
    if not ok:
        return {}
    trace = [t for r in ok for t in r["stats"]["trace"]]
    n, seconds, tokens = len(trace), sum(t[3] for t in trace), sum(t[2] + 1 for t in trace)
    kinds: dict[tuple, list[float]] = {}
    for t in trace:
        kinds.setdefault((t[0], t[4], t[1]), []).append(t[3])
    typical = {kind: median(v) for kind, v in kinds.items()}
    predicted = sum(t[3] if t[5] > 1 else typical[(t[0], t[4], t[1])] for t in trace)
    wait = sum(r["stats"].get("wait_time", 0.0) for r in ok)
    return {
        "rounds": n,
        "ms_per_round": 1000 * seconds / n,
        "host_ms_per_round": 1000 * (seconds - wait) / n,
        "syncs_per_round": sum(r["stats"].get("syncs", 0) for r in ok) / n,
        "tokens_per_round": tokens / n,
        "predicted_tps": tokens / predicted if predicted else None,
    }


def _compare(mine: dict[tuple, dict], base: dict[tuple, dict], k: int | None) -> dict:
    """Speed-up over the target alone on the measurements both have, the spread, acceptance, and the lossless count."""
    both = [x for x in mine if x in base]
    if not both:
        return {}
    tps = sum(mine[x]["n_tokens"] for x in both) / sum(mine[x]["total"] for x in both)
    btps = sum(base[x]["n_tokens"] for x in both) / sum(base[x]["total"] for x in both)
    ratios = [mine[x]["e2e_tps"] / base[x]["e2e_tps"] for x in both if base[x]["e2e_tps"]]
    out = dict(
        speedup=tps / btps,
        speedup_median=median(ratios),
        speedup_min=min(ratios),
        speedup_max=max(ratios),
        compared=len(both),
        identical=sum(first_mismatch(mine[x]["tokens"], base[x]["tokens"]) is None for x in both),
    )
    out.update(_acceptance([mine[x] for x in both]))
    dec = sum(mine[x]["n_tokens"] - 1 for x in both) / max(sum(mine[x]["decode_time"] for x in both), 1e-12)
    bdec = sum(base[x]["n_tokens"] - 1 for x in both) / max(sum(base[x]["decode_time"] for x in both), 1e-12)
    out["decode_speedup"] = dec / bdec if bdec else None
    mr, br = rounds([mine[x] for x in both]), rounds([base[x] for x in both])
    if mr.get("predicted_tps") and br.get("predicted_tps"):
        out["predicted_speedup"] = mr["predicted_tps"] / br["predicted_tps"]
    if k is not None and out.get("acceptance_rate") is not None:
        out["bound"] = out["acceptance_rate"] * k + 1  # ANPD's upper bound (alpha x K) + 1, alpha = the hit ratio
    return out


def render(data: dict) -> str:
    """A result's markdown report, its summary (data["summary"]) computed again from its records first."""
    kind = data["suite"]["kind"]
    if kind == "predict":
        from . import predict
        from .common import page_head

        return page_head(data) + "\n" + predict.markdown(data)
    data["summary"] = summarize(data)
    if kind == "roofline":
        from . import roofline

        roofline.summarize(data, data["summary"])
    if kind == "quality":
        from . import quality

        quality.summarize(data, data["summary"])
    return markdown(data)


def summarize(data: dict) -> list[dict]:
    """Per row: tokens/s over all its measurements and its improvement over the target alone on the same ones,
    overall and per prompt set."""
    records = data["records"]
    out = []
    for row in data["rows"]:
        mine = {(r["prompt"], r["repeat"]): r for r in records if r["row"] == row["key"]}
        entry = {
            k: row.get(k)
            for k in ("key", "target", "draft", "k", "planner", "status", "reason", "target_quant", "draft_quant")
        }
        entry["measurements"] = len(mine)
        base = {(r["prompt"], r["repeat"]): r for r in records if r["row"] == key(row["target"], "none")}
        if mine:
            entry["tokens_per_second"] = sum(r["n_tokens"] for r in mine.values()) / sum(
                r["total"] for r in mine.values()
            )
        entry.update(_compare(mine, base, row.get("k")))
        entry["rounds"] = rounds(list(mine.values()))
        sets = dict.fromkeys(r["set"] for r in mine.values())
        entry["by_set"] = {
            name: _compare({x: r for x, r in mine.items() if r["set"] == name}, base, row.get("k")) for name in sets
        }
        ref = next(
            (
                r
                for r in data["rows"]
                if r["target"] == row["target"] and (r.get("draft") or "").startswith(MLX_LM_SPEC)
            ),
            None,
        )
        if ref is not None and ref["key"] != row["key"] and row.get("draft") not in (None, "none"):
            theirs = {(r["prompt"], r["repeat"]): r for r in records if r["row"] == ref["key"]}
            entry["vs_reference"] = {
                "draft": ref["draft"],
                "by_set": {
                    name: _speedups(_compare({x: r for x, r in mine.items() if r["set"] == name}, theirs, None))
                    for name in sets
                },
            }
        out.append(entry)
    return out


def _k(e: dict) -> str:
    """A summary row's K as shown beside its drafter, with its planner mode (`suite.PLANNERS`) if any."""
    return (f" K={e['k']}" + (f" {e['planner']}" if e.get("planner") else "")) if e.get("k") else ""


def _speedups(cmp: dict) -> dict:
    """The tokens/s ratios of a `_compare` (aggregate, per-prompt min and max, prompts compared)."""
    return {k: v for k, v in cmp.items() if k in ("speedup", "speedup_min", "speedup_max", "compared")}


def _by_set_table(data: dict) -> str:
    """Per prompt set: each draft's speed-up over the target alone (aggregate, per-prompt min-max), and over
    mlx-lm's own speculative decoding where the suite has such a row, on the same prompts."""
    from ..named import short_name, table_name

    rows = [e for e in data["summary"] if e["draft"] != "none" and e.get("by_set")]
    sets = list(dict.fromkeys(name for e in rows for name in e["by_set"]))
    has_ref = any(e.get("vs_reference") for e in rows)
    if len(sets) < 2 and not has_ref:
        return ""

    def cell(c: dict | None) -> str:
        return f"{c['speedup']:.2f}× ({c['speedup_min']:.2f}–{c['speedup_max']:.2f}), n={c['compared']}" if c else "-"

    head = ["Target", "Draft", *(f"{name}: over the target alone" for name in sets)]
    head += [f"{name}: over mlx-lm-spec" for name in sets] if has_ref else []
    body = []
    for e in rows:
        line = [
            f"{short_name(e['target'])} {e.get('target_quant') or ''}".strip(),
            table_name(e["draft"]) + _k(e),
        ]
        line += [cell(e["by_set"].get(name)) for name in sets]
        if has_ref:
            vs = (e.get("vs_reference") or {}).get("by_set", {})
            line += ["(reference)" if e["draft"].startswith(MLX_LM_SPEC) else cell(vs.get(name)) for name in sets]
        body.append(line)
    return (
        "Per prompt set, as ratios of tokens/s on the prompts both rows measured: aggregate (per-prompt "
        "min–max), n = prompts\n\n" + aligned_table(tuple(head), body) + "\n"
    )


def _rounds_table(data: dict) -> str:
    """Per row: what its rounds cost, the host's part of them, and the speed-up its measured acceptance and the
    planner's warm costs predict beside the one measured (decode only, prefill left out)."""
    from ..named import short_name, table_name

    body = []
    for e in data["summary"]:
        r = e.get("rounds") or {}
        if not r:
            continue
        pred, meas = e.get("predicted_speedup"), e.get("decode_speedup")
        body.append(
            [
                f"{short_name(e['target'])} {e.get('target_quant') or ''}".strip(),
                table_name(e["draft"]),
                str(r["rounds"]),
                f"{r['tokens_per_round']:.2f}",
                f"{r['ms_per_round']:.2f}",
                f"{r['host_ms_per_round']:.2f} ({100 * r['host_ms_per_round'] / r['ms_per_round']:.0f}%)",
                f"{r['syncs_per_round']:.2f}",
                f"{meas:.2f}×" if meas else "-",
                f"{pred:.2f}×" if pred else "-",
            ]
        )
    if not body:
        return ""
    head = (
        "Target",
        "Draft",
        "Rounds",
        "Tokens/round",
        "ms/round",
        "host ms/round (share)",
        "Reads/round",
        "Decode speed-up measured",
        "predicted",
    )
    return (
        "Rounds of our engine: wall clock per round, the host's part of it (not waiting on the device), reads "
        "of the device per round; the decode speed-up over the target alone measured, and predicted from the "
        "rounds' tokens at the typical (median) cost of each kind of round\n\n" + aligned_table(head, body) + "\n"
    )


def markdown(data: dict) -> str:
    """The M3 Max table (target alone first, then each draft), then the spread, acceptance and lossless check."""
    from ..named import short_name, table_name
    from .common import page_head

    s = data["suite"]
    greedy = s["temp"] == 0
    head = [
        *page_head(data).splitlines(),
        f"- {sum(s['prompts'].values())} prompts ({', '.join(f'{v} {k}' for k, v in s['prompts'].items() if v)}), "
        f"{s['repeats']} repeat(s), at most {s['max_tokens']} new tokens, "
        + (
            f"sampling every temperature of {s['temps']} with every top-k of {s['top_ks']}; tokens/s = generated "
            "tokens / end-to-end time (prefill included)"
            if s["kind"] == "quality"
            else ("greedy" if greedy else f"temp {s['temp']}, top_p {s['top_p']}, top_k {s['top_k']}")
            + "; Token/s = generated tokens / end-to-end time (prefill included); Relative Improvement = over "
            "the target alone on the same prompts in this run"
        ),
    ]
    if not data.get("complete"):
        head += ["", "**Incomplete run** (continue it with `--resume`): the rows below cover what was measured."]
    if s["kind"] == "quality":
        from . import quality

        return "\n".join(head) + "\n\n" + quality.markdown(data)
    table, detail = [], []
    for e in data["summary"]:
        target = f"{short_name(e['target'])} {e.get('target_quant') or ''}".strip()
        draft = table_name(e["draft"]) + _k(e)
        if e["status"] != "ok":
            table.append([target, draft, e.get("draft_quant") or "?", f"unavailable: {e['reason']}", ""])
            continue
        if not e["measurements"]:
            table.append([target, draft, e.get("draft_quant") or "?", "not measured yet", ""])
            continue
        tps = e["tokens_per_second"]
        gain = improvement(e["speedup"], 1.0) if e["draft"] != "none" and e.get("speedup") else "0%"
        differs = greedy and e["draft"] != "none" and e.get("compared") and e["identical"] < e["compared"]
        flag = (
            f" (differs from the target alone on {e['compared'] - e['identical']}/{e['compared']})" if differs else ""
        )
        table.append([target, draft, e.get("draft_quant") or "N/A", f"{tps:.2f}{flag}", gain])
        if e["draft"] != "none" and e.get("compared"):
            same = f"{e['identical']}/{e['compared']}" if greedy else "n/a (sampling)"
            acc = e.get("acceptance_rate")
            detail.append(
                [
                    target,
                    draft,
                    f"{e['speedup_median']:.2f}× ({e['speedup_min']:.2f}–{e['speedup_max']:.2f})",
                    f"{100 * acc:.1f}%" if acc is not None else "-",
                    f"{e['mean_accepted']:.2f}" if e.get("mean_accepted") is not None else "-",
                    same,
                ]
            )
    out = "\n".join(head) + "\n\n" + aligned_table(M3MAX_COLUMNS, table) + "\n"
    if s["kind"] == "table" and (loop := _rounds_table(data)):
        out += "\n" + loop
    if s["kind"] == "roofline":
        from . import roofline

        out += "\n" + roofline.markdown(data)
    if s["kind"] in grids.GRIDS:
        out += "\n" + grids.GRIDS[s["kind"]](data)
    if detail:
        out += (
            "\n"
            + aligned_table(
                (
                    "Target",
                    "Draft",
                    "Speed-up per prompt: median (min–max)",
                    "Acceptance",
                    "Mean accepted",
                    "Identical to the target alone",
                ),
                detail,
            )
            + "\n"
        )
        if s["kind"] == "table" and (per_set := _by_set_table(data)):
            out += "\n" + per_set
    if data.get("training"):
        from .head import markdown as training

        out += "\n" + training(data)
    return out
