"""Real GGUF files vs. transformers' GGUF loader: tokenizer ids and greedy tokens (`golden` marker).

The goldens in tests/golden/*.json come from tests/golden/make_golden.py (transformers + torch,
float32); this test needs neither. Each golden's .gguf is looked for where its recipe assembles
it (`mlx-spec fetch <recipe>`: ~/.cache/mlx-spec/sources/<recipe>/<file>.gguf, or under
$MLX_SPEC_HOME); a model whose file is absent is skipped, naming the file.

`-k alone` checks the rebuilt tokenizer without converting the weights (seconds), so it also runs
under another transformers laid over the venv, as tests/test_gguf.py's docstring shows:

    PYTHONPATH=tf-5.17 python -m pytest -q tests/test_real_golden.py -k alone
"""

import json
import shutil
import time
from pathlib import Path

import pytest
from test_gguf import regex_warned, regex_warning_expected

from mlx_spec.make import recipes
from mlx_spec.make.resolve import recipe_source_path

GOLDEN = Path(__file__).resolve().parent / "golden"
# Read at import, before conftest points MLX_SPEC_HOME at a per-test temporary folder.
RECIPE_GGUF = {r.pypi.file: (r.name, recipe_source_path(r)) for r in recipes.all_recipes() if r.pypi and not r.base}
MODELS = sorted(p.stem for p in GOLDEN.glob("*.json"))
# A reference top-1/top-2 logit gap below this is a near-tie that numerics may flip, after which
# every later token legitimately differs. Measured max |logit(ours) - logit(transformers)| on the
# golden sequences: qwen2 1.4e-4 (float32 summation order), so 0.05 is ~350x that; gemma3 0.10,
# because mlx-lm scales Gemma embeddings by sqrt(hidden) rounded to bfloat16 where transformers
# uses float32 (with a float32 scale the gap drops to 1.4e-4) -- 0.25 exceeds twice that.
NEAR_TIE = {"gemma": 0.25}
NEAR_TIE_DEFAULT = 0.05

pytestmark = [pytest.mark.golden, pytest.mark.slow]  # a real checkpoint converted: a minute or more


def find_gguf(name: str) -> Path:
    """The cached .gguf called `name`; skips the test, naming the missing file, when it is absent."""
    if name not in RECIPE_GGUF:
        pytest.skip(f"no recipe assembles {name}")
    recipe, path = RECIPE_GGUF[name]
    if not path.is_file():
        pytest.skip(f"{path} not found (`mlx-spec fetch {recipe}` assembles it)")
    return path


@pytest.fixture(scope="module", params=MODELS)
def converted(request, tmp_path_factory):
    """(golden dict, mlx-lm model, tokenizer) for one model, converted once per module."""
    import mlx.core as mx
    import mlx_lm

    from mlx_spec.make.gguf_weights import gguf_to_hf

    golden = json.loads((GOLDEN / f"{request.param}.json").read_text())
    path = find_gguf(golden["gguf_file"])
    out = tmp_path_factory.mktemp(request.param)
    t = time.time()
    gguf_to_hf(path, out, dtype="float32")
    print(f"\n{request.param}: converted in {time.time() - t:.1f}s")
    model, tok = mlx_lm.load(str(out))
    mx.eval(model.parameters())
    shutil.rmtree(out)  # the weights are in memory now: 7 GB less on disk per run (pytest keeps three runs' folders)
    return golden, model, tok


@pytest.fixture(scope="module", params=MODELS)
def rebuilt(request, tmp_path_factory):
    """(golden dict, folder) for one model: what gguf_to_hf writes, its weights left out."""
    import mlx_spec.make.gguf_weights as g

    golden = json.loads((GOLDEN / f"{request.param}.json").read_text())
    path = find_gguf(golden["gguf_file"])
    out = tmp_path_factory.mktemp(request.param + "-tokenizer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "_write_weights", lambda *args: None)
        g.gguf_to_hf(path, out)
    return golden, out


def first_greedy_miss(model, ids: list[int], want: list[int]) -> tuple[int, list[int]]:
    """Where plain greedy decoding from `ids` first leaves `want`, and the argmax tokens, from ONE forward pass
    over ids + want (teacher forcing): while greedy's tokens equal want's, its context at step i is exactly
    ids + want[:i], so its i-th token is the argmax at that position, and the first index where the argmax
    differs from want is where greedy would leave it. One pass instead of len(want) decode steps (the 1.5B
    took 83 s for them here)."""
    import mlx.core as mx

    logits = model(mx.array([ids + want[:-1]]))[0, len(ids) - 1 :]
    got = mx.argmax(logits, axis=-1).tolist()
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want)), got


def required_prefix(margins: list[float], gguf_file: str) -> int:
    """How many leading tokens must match: all those before the first near-tie step."""
    tie = next((v for k, v in NEAR_TIE.items() if gguf_file.startswith(k)), NEAR_TIE_DEFAULT)
    return next((i for i, m in enumerate(margins) if m < tie), len(margins))


def check_tokenizations(golden, tok):
    for case in golden["tokenizations"]:
        assert tok.encode(case["text"]) == case["ids"], repr(case["text"])


def check_prompt_ids(golden, tok):
    for p in golden["prompts"]:
        if p["kind"] == "chat":
            msgs = [{"role": "user", "content": p["message"]}]
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            assert text == p["text"]
            assert tok.encode(text, add_special_tokens=False) == p["ids"]
        else:
            assert tok.encode(p["text"]) == p["ids"]


def test_tokenizations_match_golden(converted):
    golden, _, tok = converted
    check_tokenizations(golden, tok)


def test_prompt_ids_match_golden(converted):
    golden, _, tok = converted
    check_prompt_ids(golden, tok)


def test_rebuilt_tokenizer_alone_matches_golden(rebuilt):
    """transformers' own AutoTokenizer on the rebuilt folder: the golden ids, and no "incorrect
    regex pattern" warning where the config.json stamp can prevent it."""
    from transformers import AutoTokenizer

    golden, folder = rebuilt
    assert regex_warned(folder) == regex_warning_expected(stamped=True)
    tok = AutoTokenizer.from_pretrained(str(folder))
    check_tokenizations(golden, tok)
    check_prompt_ids(golden, tok)


def test_greedy_tokens_match_golden(converted):
    golden, model, tok = converted
    report = []
    for p in golden["prompts"]:
        want = p["golden_ids"]
        same, got = first_greedy_miss(model, p["ids"], want)
        need = required_prefix(p["margins"], golden["gguf_file"])
        report.append(f"{same}/{len(want)} match (need {need})")
        assert same >= need, (
            f"{golden['gguf_file']}: first {same} of {len(want)} tokens match, need "
            f"{need}\n got  {tok.decode(got[: same + 1])!r}\n want {tok.decode(want)!r}"
        )
    print(f"\n{golden['gguf_file']}: " + "; ".join(report))
