"""parallelize on every Llama-like decoder family of the installed transformers (the
survey of model_zoo.py), tiny and random, at tp=2 with sequence parallelism on 2 gloo
ranks against the same model on one process (real_models.check, high precision): each
family is planned and matches, or is refused with a ValueError before any change. The
results are the table at the end of docs/parallelism.md: ``MX_UPDATE_DOCS=1`` rewrites
it, otherwise the test checks it is current."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from mx_dtensor.testing import spawn

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
import model_zoo  # noqa: E402
from real_models import zoo_check  # noqa: E402

needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


def test_survey_is_deterministic_and_keeps_the_llama_likes():
    families = model_zoo.survey()
    assert [f.model_type for f in families] == sorted(f.model_type for f in families)
    kept = model_zoo.kept()
    for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo2", "phi3"):
        assert name in kept, (name, kept)
    verdicts = {f.model_type: f.verdict for f in families}
    assert verdicts["mixtral"] == "MoE" and verdicts["qwen3_moe"] == "MoE"
    assert verdicts["gemma3"] == "multimodal" and verdicts["llama4"] == "multimodal"
    assert verdicts["bart"] == "encoder-decoder" and verdicts["gpt2"] == "other"


@needs_dist
def test_every_family_is_planned_or_refused_before_any_change():
    # One spawn for every family (and one test, so that pytest-xdist does not spawn
    # twice): starting the ranks costs seconds, each family well under one.
    results = spawn(zoo_check, 2, model_zoo.kept())[0]
    problems = []
    for t, res in results.items():
        ok, text = model_zoo.outcome(res)
        if not ok:  # a crash with its whole traceback
            problems.append(f"{t}: {res.get('crashed', text)}")
    section = model_zoo.doc_section(model_zoo.survey(), results)
    if os.environ.get("MX_UPDATE_DOCS") == "1":
        model_zoo.write_docs_section(section)
    if model_zoo.docs_section_now() != section:
        problems.append(
            f"the model-zoo section of {model_zoo.DOC} is not what the test finds; rerun "
            f"with MX_UPDATE_DOCS=1 to rewrite it"
        )
    assert not problems, "\n\n".join(problems)
