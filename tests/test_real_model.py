"""Opt-in: the accuracy claims of docs/BENCHMARKS.md ("Accuracy on a real pretrained model") on SmolLM2-135M.

The model is 0.5 GB and each calibrated recipe takes minutes on two cores, so these tests run only when
QUANTKIT_REAL_MODEL names the folder that ``python benchmarks/real_model.py`` writes:

    QUANTKIT_REAL_MODEL=~/.cache/quantkit/smollm2-135m python -m pytest -q tests/test_real_model.py

The protocol is BENCHMARKS': perplexity on every 1024-token window of the pydoc test split, each recipe at its own
defaults with 64 calibration windows of 512 tokens of kjv+pydoc.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MODEL = os.environ.get("QUANTKIT_REAL_MODEL")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not MODEL, reason="set QUANTKIT_REAL_MODEL to the benchmarks/real_model.py folder")]

CALIB_SAMPLES, CALIB_SEQLEN = 64, 512


@pytest.fixture(scope="module")
def scored():
    """ppl of the FP model and of each recipe (computed once, on demand)."""
    from quantkit.data import joined_text
    from quantkit.data.tokens import encode
    from quantkit.eval import perplexity
    from quantkit.model import load_model
    from quantkit.quant.act import remove_hooks
    from quantkit.quant.apply import quantize_model
    from quantkit.quant.recipe import load_recipe

    loaded = load_model(str(Path(MODEL).expanduser()), device="cpu")
    model, tok = loaded.model, loaded.tokenizer
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ids = encode(tok, joined_text("pydoc", "test"))
    cache = {"fp": perplexity(model, ids, 1024, None).ppl}

    def score(recipe: str, plan=None) -> float:
        key = (recipe, None if plan is None else id(plan))
        if key not in cache:
            model.load_state_dict(original)
            r = load_recipe(recipe)
            calibrated = r.uses_calibration
            res = quantize_model(model, tok, r, plan=plan, device="cpu", samples=CALIB_SAMPLES if calibrated else None,
                                 seqlen=CALIB_SEQLEN if calibrated else None)
            cache[key] = perplexity(model, ids, 1024, None).ppl
            remove_hooks(res.act_handles)
        return cache[key]

    return cache["fp"], score


def test_gptq_and_awq_beat_rtn(scored):
    fp, score = scored
    rtn = score("rtn-w4a16-g128")
    assert score("gptq-w4a16-g128") < rtn
    assert score("awq-w4a16-g128") < rtn


def test_liquidquant_w4a8_close_to_gptq_w4a16(scored):
    fp, score = scored
    assert score("lqq-w4a8") - fp <= 1.2 * (score("gptq-w4a16-g128") - fp)


def test_mixllm_p10_on_the_fast_path_cuts_p0_by_a_third(scored, tmp_path_factory):
    from quantkit.search.command import run_search
    from quantkit.search.plan_check import read_plan

    fp, score = scored
    plan = tmp_path_factory.mktemp("plan") / "p10.json"
    run_search(str(Path(MODEL).expanduser()), str(plan), "mixllm-lqq-w4a8", bits="4,8", target_bits=4.4,
               samples=CALIB_SAMPLES, seqlen=CALIB_SEQLEN, device="cpu", show_progress=False)
    p0, p10 = score("mixllm-lqq-w4a8"), score("mixllm-lqq-w4a8", read_plan(str(plan)))
    assert p10 - fp <= (2 / 3) * (p0 - fp)


@pytest.mark.parametrize("recipe", ["smoothquant-w8a8-g128", "quarot-w8a8"])
def test_per_token_a8_with_smoothing_or_rotation_within_one_percent(scored, recipe):
    fp, score = scored
    assert score(recipe) <= 1.01 * fp
