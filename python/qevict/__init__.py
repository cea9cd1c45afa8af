"""qevict: long-context LLM decoding with a recoverable tiered KV cache (Python bindings).

    import qevict
    m = qevict.Model("model.gguf")
    r = m.generate("Once upon a time", max_tokens=32, kv_policy="qevict", kv_budget=0.2)
    r["text"], r["cache"]["bytes_held"], r["cache"]["tier_map"]   # NumPy uint8 [units, positions]
    logits, cache = m.logits(m.tokenize("some text"), kv_policy="h2o", kv_budget=0.5)
    qevict.set_matmul("f32")   # exact decode matmuls (default "q8": llama.cpp's 8-bit activations)

A conversation whose compressed cache is kept turn after turn (every kv_<option> of the CLI's
--kv-<option> flags as a keyword):
    s = m.session(kv_policy="qevict", kv_budget=0.2, n_ctx=4096)
    s.append("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    r = s.generate(max_tokens=64, temperature=0.0, stop=["\n\n"])   # r["text"], r["tokens"]
    s.cache["bytes_quant"], s.tokens, s.turns[-1]["promotions"]
    s.save("chat.qsess"); s2 = qevict.Session.load(m, "chat.qsess")
"""
from ._qevict import Model, Session, matmul, policies, set_matmul  # noqa: F401

# Tier values of the tier map (kvcache/tier.h).
TIER_LOCAL, TIER_FULL, TIER_QUANT, TIER_EVICTED = 0, 1, 2, 3
