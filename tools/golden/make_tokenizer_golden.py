#!/usr/bin/env python3
"""Writes tests/golden/tokenizer_golden.json: llama.cpp's token ids for every string of
tests/golden/tokenizer_corpus.json, the reference that tests/tokenizer/ checks qevict against.

Run it with the llama-cpp-python virtualenv (llama-cpp-python 0.3.16, built from source):

    /root/.cache/qevict/venv/bin/python tools/golden/make_tokenizer_golden.py \
        --model /root/.cache/qevict/model/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/golden/tokenizer_golden.json

For each corpus string it records llm.tokenize(text, add_bos=False, special=False) and
special=True. It also re-tokenizes the corpus (special=False) with other pre-tokenizers:
it writes a vocab-only copy of the model's metadata (no tensors) with tokenizer.ggml.pre
replaced, loads that in llama.cpp, and records the ids. The C++ test builds the same
variant in memory, so one vocabulary exercises the gpt-2, llama3, qwen2 and default
pre-tokenizer paths of llama.cpp too.
"""

import argparse
import json
import os
import struct
import sys
import tempfile

# Pre-tokenizer names (tokenizer.ggml.pre) to check besides the model's own.
VARIANT_PRES = ["gpt-2", "llama-bpe", "qwen2", "default"]

# GGUF value types (ggml docs/gguf.md) and the byte size of the fixed-size ones.
GGUF_STRING, GGUF_ARRAY = 8, 9
FIXED_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(buf, pos, vtype):
    """Returns the offset just past one value of type vtype that starts at pos."""
    if vtype in FIXED_SIZE:
        return pos + FIXED_SIZE[vtype]
    if vtype == GGUF_STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == GGUF_ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in FIXED_SIZE:
            return pos + FIXED_SIZE[etype] * count
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def _gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_variant(model_path, pre, out_path):
    """Writes a GGUF holding the model's metadata, with tokenizer.ggml.pre = pre, and no tensors."""
    with open(model_path, "rb") as f:
        buf = f.read()
    magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF":
        raise ValueError(f"{model_path}: not a GGUF file")
    pos = 24
    entries = []
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8 : pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
        if key == "tokenizer.ggml.pre":
            entries.append(_gguf_string(key) + struct.pack("<I", GGUF_STRING) + _gguf_string(pre))
        else:
            entries.append(buf[start:pos])
    with open(out_path, "wb") as f:
        f.write(struct.pack("<4sIQQ", b"GGUF", version, 0, len(entries)))
        for e in entries:
            f.write(e)


def tokenize_all(llama_cls, model_path, corpus, special_modes):
    llm = llama_cls(model_path=model_path, vocab_only=True, verbose=False)
    out = {}
    for special in special_modes:
        out[special] = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=special) for t in corpus]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF model whose vocabulary to use")
    ap.add_argument("--corpus", default=os.path.join(repo, "tests/golden/tokenizer_corpus.json"))
    ap.add_argument("--out", required=True, help="where to write the golden JSON")
    args = ap.parse_args()

    import llama_cpp  # imported here so that --help works without the virtualenv
    from llama_cpp import Llama

    with open(args.corpus, encoding="utf-8") as f:
        corpus = json.load(f)

    base = tokenize_all(Llama, args.model, corpus, [False, True])
    golden = {
        "generator": "tools/golden/make_tokenizer_golden.py",
        "reference": f"llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.basename(args.model),
        "cases": [
            {"text": t, "ids": a, "ids_special": b}
            for t, a, b in zip(corpus, base[False], base[True])
        ],
        "pre_variants": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for pre in VARIANT_PRES:
            path = os.path.join(tmp, f"vocab-{pre}.gguf")
            write_variant(args.model, pre, path)
            ids = tokenize_all(Llama, path, corpus, [False])[False]
            golden["pre_variants"].append({"pre": pre, "ids": ids})

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    n_ids = sum(len(c["ids"]) for c in golden["cases"])
    print(f"wrote {args.out}: {len(corpus)} strings, {n_ids} ids (special=False), "
          f"{len(VARIANT_PRES)} pre-tokenizer variants", file=sys.stderr)


if __name__ == "__main__":
    main()
