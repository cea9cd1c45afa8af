"""The Python bindings (python/qevict_py.cpp) on the real model: generate() reproduces
`qevict generate` exactly (greedy), logits match a FullKV pass and differ under a budget,
the tier map and stats describe the cache, bad options raise ValueError.

Run by CTest (PythonBindings) with PYTHONPATH=build/python; needs QEVICT_TEST_MODEL and
QEVICT_CLI (the qevict binary)."""
import os
import subprocess

import numpy as np
import pytest

import qevict

MODEL = os.environ.get("QEVICT_TEST_MODEL", "")
CLI = os.environ.get("QEVICT_CLI", "")
pytestmark = pytest.mark.skipif(not MODEL, reason="QEVICT_TEST_MODEL is not set")
PROMPT = "The history of the printing press begins"


@pytest.fixture(scope="module")
def model():
    # The exact matmul path: test_logits_... compares chunkings at f32 rounding, which the
    # 8-bit decode path (calls under 32 tokens) does not keep. The CLI run beside it uses the
    # same path (generate --matmul f32).
    qevict.set_matmul("f32")
    return qevict.Model(MODEL, threads=2)


def test_matmul_switch():
    with pytest.raises(ValueError):
        qevict.set_matmul("int4")
    qevict.set_matmul("f32")
    assert qevict.matmul() == "f32"


def test_generate_reproduces_the_cli(model):
    r = model.generate(PROMPT, max_tokens=24, temperature=0.0)
    cli = subprocess.run([CLI, "generate", "-m", MODEL, "-t", "2", "-p", PROMPT, "-n", "24",
                          "--temp", "0", "--matmul", "f32"], capture_output=True, text=True,
                         check=True).stdout
    assert cli in (PROMPT + r["text"], PROMPT + r["text"] + "\n")
    assert r["prompt_tokens"] == len(model.tokenize(PROMPT))


def test_budgeted_generate_reports_its_cache(model):
    text = "The quick brown fox jumps over the lazy dog. " * 40
    r = model.generate(text, max_tokens=16, kv_policy="qevict", kv_budget=0.3)
    c = r["cache"]
    assert c["policy"] == "qevict" and c["bytes_held"] > 0 and c["routing_events"] > 0
    tiers = c["tier_map"]
    info = model.info()
    assert tiers.dtype == np.uint8 and tiers.shape[0] == info["n_layers"]
    assert tiers.shape[1] == r["prompt_tokens"] + len(r["tokens"]) - 1  # last token not fed
    assert (tiers == qevict.TIER_EVICTED).any() and (tiers == qevict.TIER_FULL).any()
    full = model.generate(text, max_tokens=16)["cache"]
    assert c["bytes_held"] < full["bytes_held"]


def test_logits_match_full_and_differ_under_a_budget(model):
    toks = model.tokenize("A long time ago in a distant land there lived a king. " * 12)
    full, rep = model.logits(toks)
    assert full.shape == (len(toks), model.info()["n_vocab"]) and np.isfinite(full).all()
    # Other chunk sizes batch the matmuls differently: f32 rounding only.
    again, _ = model.logits(toks, chunk=37)
    assert np.abs(again - full).max() < 0.05
    assert (again.argmax(1) == full.argmax(1)).mean() > 0.98
    h2o, rep2 = model.logits(toks, kv_policy="h2o", kv_budget=0.3, chunk=64)
    assert np.isfinite(h2o).all() and rep2["evictions"] > 0
    assert np.abs(h2o[:64] - full[:64]).max() < 0.05  # the first chunk: nothing evicted yet
    assert np.abs(h2o[-1] - full[-1]).max() > 0.1  # then compression changes the logits


def test_bad_options_raise(model):
    with pytest.raises(ValueError, match="unknown KV policy"):
        model.generate(PROMPT, kv_policy="nope")
    with pytest.raises(ValueError):
        model.generate(PROMPT, kv_policy="qevict", kv_budget=-1.0)
    # prefill_route and kv_score go through the KV option parser the sessions use, too.
    with pytest.raises(ValueError, match="prefill_route must be"):
        model.generate(PROMPT, kv_policy="qevict", kv_budget=0.3, prefill_route="nope")
    with pytest.raises(ValueError, match="score must be"):
        model.generate(PROMPT, kv_policy="qevict", kv_budget=0.3, kv_score="nope")
    with pytest.raises(ValueError, match="prefill_route must be"):
        model.logits([1, 2, 3], kv_policy="qevict", kv_budget=0.3, prefill_route="nope")
    assert "qevict" in qevict.policies() and "snapkv" in qevict.policies()
