"""A/B of two revisions in one run, interleaved: each prompt, each drafter row, both sides alternating (ABBA)."""
import argparse, json, os, subprocess, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--target"); ap.add_argument("--rows"); ap.add_argument("--humaneval", type=int, default=0)
ap.add_argument("--edit", type=int, default=0); ap.add_argument("--prose", type=int, default=0)
ap.add_argument("--max-tokens", type=int, default=128); ap.add_argument("--out"); ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--sides", default="new,old"); ap.add_argument("--start", type=int, default=0)  # skip the first prompts
ap.add_argument("--worker", default="/work/ab/worker.py")  # worker_tree.py: a row 'D#chain' is D with no trees
a = ap.parse_args()
sides = {"new": ("/work/main/.venv/bin/python", "/work/main"), "old": ("/work/base/.venv/bin/python", "/work/base")}
sides = {k: sides[k] for k in a.sides.split(",")}
procs = {}
for name, (py, cwd) in sides.items():
    procs[name] = subprocess.Popen([py, a.worker, a.target], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print(name, procs[name].stdout.readline().strip(), flush=True)
sys.path.insert(0, "/work/main")
import mlx_spec  # noqa
from mlx_spec.bench.prompts import build, WARMUP_PROMPT, chat_ids
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_spec.make.resolve import resolve
tok = load_tokenizer(resolve(a.target))
prompts = build(tok, a.humaneval, a.edit, n_prose=a.prose)[a.start:]
rows = ["none"] + [r for r in a.rows.split(",") if r]
def ask(side, ids, draft):
    procs[side].stdin.write(json.dumps({"ids": ids, "draft": draft, "max_tokens": a.max_tokens}) + "\n"); procs[side].stdin.flush()
    return json.loads(procs[side].stdout.readline())
for side in sides:  # warm-up
    for d in rows:
        ask(side, chat_ids(tok, WARMUP_PROMPT), d)
records, order = [], 0
for rep in range(a.repeats):
    for p in prompts:
        for d in rows:
            pair = list(sides) if order % 2 == 0 else list(sides)[::-1]
            order += 1
            for side in pair:
                r = ask(side, p.ids, d)
                records.append({"side": side, "prompt": p.id, "set": p.set, "draft": d, "repeat": rep, **r,
                                "at": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg()[0]})
                print(side, p.id, d, round(r["decode_tps"], 2), r["drafted"], len(r["tokens"]), flush=True)
            json.dump({"args": vars(a), "records": records, "script": open(__file__).read(),
                       "worker": open(a.worker).read()}, open(a.out, "w"))
