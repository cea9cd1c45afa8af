"""Sessions in the Python bindings (issue 50 item 5): model.session(kv_...) keeps a conversation's
compressed cache turn after turn; two turns reuse the first; save -> Session.load continues with
the same greedy tokens and the same cache; a damaged file raises a clear error.

Run by CTest (PythonBindings) with PYTHONPATH=build/python; needs QEVICT_TEST_MODEL."""
import os

import pytest

import qevict

MODEL = os.environ.get("QEVICT_TEST_MODEL", "")
pytestmark = pytest.mark.skipif(not MODEL, reason="QEVICT_TEST_MODEL is not set")

# Long enough that a 20 % budget of a 512-token context compresses (windows in the low-bit tier).
TURN1 = ("<|im_start|>user\nHere are some notes. " +
         "The keeper of the lighthouse on the northern cape writes the weather in a blue book. " * 20 +
         "Remember them.<|im_end|>\n<|im_start|>assistant\n")
TURN2 = "<|im_end|>\n<|im_start|>user\nWhat colour is the book?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model():
    qevict.set_matmul("f32")
    return qevict.Model(MODEL, threads=2)


def make(model):
    return model.session(kv_policy="qevict", kv_budget=0.2, n_ctx=512, prefill_chunk=128)


def test_two_turns_reuse_the_first(model):
    s = make(model)
    t1 = s.append(TURN1)
    assert t1["reused_tokens"] == 0 and t1["prompt_tokens"] == len(s.tokens)
    r1 = s.generate(max_tokens=8)
    assert len(r1["tokens"]) >= 1 and isinstance(r1["text"], str)
    held = len(s.tokens)
    r2 = s.generate(TURN2, max_tokens=8)
    turn = r2["turn"]
    # The second turn prefilled only its own tokens (and the pending generated one).
    assert turn["reused_tokens"] == held - 1
    assert turn["prompt_tokens"] == len(s.tokens) - len(r2["tokens"]) - turn["reused_tokens"]
    assert len(s.turns) == 3 and s.turns[-1] == turn
    c = s.cache
    assert c["policy"] == "qevict" and c["bytes_quant"] > 0, "the test needs a cache that compressed"
    assert c["n_past"] == len(s.tokens) - 1  # the last generated token is pending
    assert c["tier_map"].shape[1] == c["n_past"]
    full = model.session(n_ctx=512)
    full.append(TURN1)
    assert full.cache["bytes_held"] > c["bytes_held"]


def test_stop_strings_cut_the_text(model):
    s = model.session(n_ctx=512)
    s.append("Count: one, two, three, four, five, six,")
    r = s.generate(max_tokens=24, stop=[","])
    assert r["stop"] == "," and "," not in r["text"] and r["hit_stop"]


def test_save_load_gives_the_same_greedy_continuation(model, tmp_path):
    s = make(model)
    s.append(TURN1)
    s.generate(max_tokens=6)
    path = str(tmp_path / "chat.qsess")
    assert s.cache["bytes_quant"] > 0, "the test needs a cache that compressed"
    assert s.save(path) == "state"
    t = qevict.Session.load(model, path)
    assert t.tokens == s.tokens
    # The same tiers and bytes by tier (bytes_held counts allocations, which a restored cache
    # makes to fit: it may hold less slack than the original).
    for k in ("bytes_sink", "bytes_full", "bytes_quant", "n_past"):
        assert t.cache[k] == s.cache[k], k
    assert (t.cache["tier_map"] == s.cache["tier_map"]).all()
    again = str(tmp_path / "again.qsess")
    t.save(again)
    assert open(again, "rb").read() == open(path, "rb").read()
    a = s.generate(TURN2, max_tokens=16)
    b = t.generate(TURN2, max_tokens=16)
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]
    assert t.tokens == s.tokens


def test_adapt_reports_its_choice_and_a_saved_session_keeps_it(model, tmp_path):
    # --kv-adapt 100: every prompt's focus (KL, nats) is below it, so the coverage tier.
    s = model.session(kv_policy="qevict", kv_budget=0.2, n_ctx=512, prefill_chunk=128, kv_adapt=100)
    s.append(TURN1)
    s.generate(max_tokens=6)
    c = s.cache
    assert c["adapted"] == "coverage" and 0 < c["focus"] < 100
    assert len(c["prompt_focus"]) == model.info()["n_layers"]
    assert "coverage tier" in c["describe"] and "INT2" in c["describe"]
    plain = make(model)
    plain.append(TURN1)
    assert plain.cache["adapted"] == "" and plain.cache["focus"] == 0  # measured only to adapt
    path = str(tmp_path / "adapted.qsess")
    assert s.save(path) == "state"
    t = qevict.Session.load(model, path)
    assert t.cache["adapted"] == "coverage" and t.cache["focus"] == c["focus"]
    assert (t.cache["tier_map"] == c["tier_map"]).all()
    a = s.generate(TURN2, max_tokens=12)
    b = t.generate(TURN2, max_tokens=12)
    assert a["tokens"] == b["tokens"]


def test_damaged_files_raise_clear_errors(model, tmp_path):
    s = make(model)
    s.append(TURN1)
    path = tmp_path / "chat.qsess"
    s.save(str(path))
    data = path.read_bytes()
    bad = tmp_path / "truncated.qsess"
    bad.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated"):
        qevict.Session.load(model, str(bad))
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="checksum"):
        qevict.Session.load(model, str(bad))
    with pytest.raises(ValueError, match="cannot open"):
        qevict.Session.load(model, str(tmp_path / "missing.qsess"))


def test_bad_arguments_raise(model):
    with pytest.raises(ValueError, match="unknown keyword argument 'kv_nope'"):
        model.session(kv_nope=1)
    with pytest.raises(ValueError, match="unknown KV policy"):
        model.session(kv_policy="nope")
    s = model.session(kv_policy="qevict", kv_budget=0.5, kv_window=16, kv_prefill_route="chunk")
    assert "ω 16" in s.cache["describe"]
    with pytest.raises(ValueError, match="out of range"):
        s.append([10**9])
    with pytest.raises(ValueError, match="nothing to generate"):
        s.generate(max_tokens=4)
