#!/usr/bin/env python3
"""Writes tests/golden/model_golden*.json from llama.cpp (llama-cpp-python, f16 KV cache): the
independent reference the end-to-end tests compare qevict's forward pass with.

    python=$(tools/venv.sh)
    $python tools/golden/make_model_golden.py --model smollm2            # model_golden.json
    $python tools/golden/make_model_golden.py --model qwen2.5-coder-0.5b # model_golden_qwen2.5-coder-0.5b.json
    $python tools/golden/make_model_golden.py --model path/to/model.gguf --out OUT.json \
        --full-logits-dir /tmp/golden

--model is a name tools/fetch_model.sh knows (fetched, then used) or a GGUF path; --out
defaults to tests/golden/model_golden.json for smollm2 (the default model) and to
tests/golden/model_golden_NAME.json for the other names.

llama.cpp runs on an F32 copy of the model's weights (tools/golden/dequantize_gguf.py,
gguf-py's dequantizers): on the quantized file itself llama.cpp rounds activations to 8 bits
inside its matmuls, which moves it ~5e-3 nats (mean KL) away from the exact function of the
stored weights — the function qevict computes. With --full-logits-dir it also saves the
logits of llama.cpp on the quantized file itself (llama_q.npy) next to the F32 ones
(llama_f32.npy), so that both comparisons can be reported (tools/measure_fidelity.sh).

It records, with llama.cpp's own tokenization (so the C++ test does not depend on ours):
  * teacher-forced: the first N tokens of tests/golden/english_gpl3.txt, and at 64 evenly
    spread positions the top-16 (id, logit) of llama.cpp's logits;
  * greedy: a committed prompt (ChatML, as the model's template renders it), and the 64
    tokens llama.cpp's greedy decoding produces, with the top-2 logits at every step.
--full-logits also saves all N rows of logits [N, n_vocab] as float32 .npy (not committed)
for tools/compare_logits.py, which measures top-1 agreement and mean KL over every position.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The greedy prompt per architecture, ChatML as each model's chat template renders it (the
# llama entry is SmolLM2's, unchanged since model_golden.json was first made).
GREEDY_PROMPTS = {
    "llama": (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nExplain in a few sentences why the sky is blue.<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "qwen2": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite a Python function that tells whether a number is prime.<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve_model(model):
    """A GGUF path as given, or the path tools/fetch_model.sh prints for a model name."""
    if os.path.exists(model) or model.endswith(".gguf"):
        return model, None
    out = subprocess.run([os.path.join(ROOT, "tools/fetch_model.sh"), model], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1], model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="a tools/fetch_model.sh name or a GGUF path")
    ap.add_argument("--text", default=os.path.join(ROOT, "tests/golden/english_gpl3.txt"))
    ap.add_argument("--n-tokens", type=int, default=1100)
    ap.add_argument("--out", default="", help="default: tests/golden/model_golden[_NAME].json")
    ap.add_argument("--full-logits-dir", default="")
    ap.add_argument("--f32-copy", default="", help="where to keep the F32 copy (default: next to --model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    args.model, name = resolve_model(args.model)
    if not args.out:
        suffix = "" if name in (None, "smollm2") else "_" + name
        args.out = os.path.join(ROOT, f"tests/golden/model_golden{suffix}.json")

    f32 = args.f32_copy or os.path.splitext(args.model)[0] + ".f32.gguf"
    if not os.path.exists(f32):
        subprocess.run([sys.executable, os.path.join(HERE, "dequantize_gguf.py"), args.model, f32], check=True)

    def load(path):
        return Llama(model_path=path, n_ctx=2048, n_batch=512, logits_all=True, verbose=False,
                     n_threads=args.threads, seed=0)

    with open(args.text, "rb") as f:
        text = f.read()
    if args.full_logits_dir:
        os.makedirs(args.full_logits_dir, exist_ok=True)
        llm_q = load(args.model)
        tokens = llm_q.tokenize(text, add_bos=False, special=False)[: args.n_tokens]
        llm_q.eval(tokens)
        np.save(os.path.join(args.full_logits_dir, "llama_q.npy"), np.array(llm_q.scores[: len(tokens)], dtype=np.float32))
        del llm_q
    llm = load(f32)
    arch = llm.metadata.get("general.architecture", "llama")
    if arch not in GREEDY_PROMPTS:
        sys.exit(f"no greedy prompt for architecture {arch}: add one to GREEDY_PROMPTS")
    greedy_prompt = GREEDY_PROMPTS[arch]
    tokens = llm.tokenize(text, add_bos=False, special=False)[: args.n_tokens]
    if len(tokens) < args.n_tokens:
        sys.exit(f"text has only {len(tokens)} tokens")
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    if args.full_logits_dir:
        np.save(os.path.join(args.full_logits_dir, "llama_f32.npy"), logits)
    positions = [int(round(i * (len(tokens) - 1) / 63)) for i in range(64)]
    tf = []
    for p in positions:
        top = np.argsort(-logits[p], kind="stable")[:16]
        tf.append({"pos": p, "ids": [int(i) for i in top], "logits": [float(logits[p][i]) for i in top]})

    prompt_ids = llm.tokenize(greedy_prompt.encode(), add_bos=False, special=True)
    llm.reset()
    llm.eval(prompt_ids)
    greedy, top2 = [], []
    for _ in range(64):
        z = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-z, kind="stable")[:2]
        tok = int(order[0])
        greedy.append(tok)
        top2.append([[int(order[0]), float(z[order[0]])], [int(order[1]), float(z[order[1]])]])
        llm.eval([tok])

    out = {
        "generator": f"tools/golden/make_model_golden.py with llama-cpp-python {llama_cpp_version}",
        "model_sha256": sha256(args.model),
        "kv_type": "f16",
        "reference": "llama.cpp on an F32 copy of the model's weights (tools/golden/dequantize_gguf.py)",
        "text": os.path.relpath(args.text, ROOT),
        "tokens": [int(t) for t in tokens],
        "teacher_forced": tf,
        "greedy": {"prompt": greedy_prompt, "prompt_ids": [int(t) for t in prompt_ids], "ids": greedy, "top2": top2},
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(tokens)} tokens, 64 positions, 64 greedy tokens")


if __name__ == "__main__":
    main()
