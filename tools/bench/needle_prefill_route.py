#!/usr/bin/env python3
"""A quick needle probe of --prefill-route (SPEC §4, issue 11): a RULER-style magic number
placed early in ~3,000 tokens of real prose (the Debian license texts), the question at the
end, answered by `qevict generate --chat --temp 0` under several KV configurations. A sample
is right when the 7-digit number appears in the answer. A quality measure, not a timing:
run it nice'd. Only the standard library is needed.

    nice -n 19 python3 tools/bench/needle_prefill_route.py \\
        --model "$(tools/fetch_model.sh qwen2.5-coder-0.5b)" --samples 8

Prints a markdown table (right answers per configuration) and writes every answer as JSONL
to --out (default: /tmp/needle_prefill_route.jsonl; not for committing).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = ["GPL-3", "GFDL-1.3", "MPL-2.0", "Apache-2.0"]
KEYS = ["amber-falcon", "silent-river", "copper-lantern", "north-orchard", "velvet-harbor",
        "quiet-meadow", "iron-compass", "paper-glacier", "scarlet-ember", "hollow-summit"]
CONFIGS = {
    "full": ["--kv-policy", "full"],
    "qevict@0.2 chunk": ["--kv-policy", "qevict", "--kv-budget", "0.2", "--prefill-route",
                         "chunk"],
    "qevict@0.2 end": ["--kv-policy", "qevict", "--kv-budget", "0.2", "--prefill-route", "end"],
    "qevict@0.2 end window 32": ["--kv-policy", "qevict", "--kv-budget", "0.2",
                                 "--prefill-route", "end", "--prefill-window", "32"],
}


def haystack(i, chars):
    # Whole paragraphs of one license text (the texts cycle; offsets vary with the sample).
    text = open(os.path.join("/usr/share/common-licenses", TEXTS[i % len(TEXTS)])).read()
    text = text * (1 + (2 * chars) // len(text))
    start = (i // len(TEXTS)) * 4000 % max(1, len(text) - chars)
    start = text.find("\n\n", start) + 2
    return text[start:start + chars]


def make_prompt(i, chars, rng):
    key, number = KEYS[i % len(KEYS)], str(rng.randrange(1000000, 10000000))
    hay = haystack(i, chars)
    # The needle goes at a paragraph break 5-30 % into the text: read long before the question.
    at = hay.find("\n\n", int(len(hay) * rng.uniform(0.05, 0.30)))
    at = at + 2 if at >= 0 else len(hay) // 10
    needle = f"One of the special magic numbers for {key} is: {number}.\n\n"
    # RULER's niah template (RULER/scripts/data/synthetic/constants.py), without its answer
    # prefix (the chat template would close it as a user message).
    prompt = ("Some special magic numbers are hidden within the following text. Make sure to "
              "memorize it. I will quiz you about the numbers afterwards.\n"
              f"{hay[:at]}{needle}{hay[at:]}\n"
              f"What is the special magic number for {key} mentioned in the provided text?")
    return prompt, number, at / len(hay)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--chars", type=int, default=14000, help="haystack characters (~3K tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="/tmp/needle_prefill_route.jsonl")
    a = ap.parse_args()
    rng = random.Random(11)
    configs = a.configs.split(",")
    right = {c: 0 for c in configs}
    with open(a.out, "w") as out:
        for i in range(a.samples):
            prompt, number, depth = make_prompt(i, a.chars, rng)
            path = f"/tmp/needle_prefill_route_{i}.txt"
            open(path, "w").write(prompt)
            for c in configs:
                cmd = [a.qevict, "generate", "-m", a.model, "-f", path, "--chat", "--temp", "0",
                       "-n", "24", "-c", "32768", "-t", str(a.threads), "--kv-stats"] + CONFIGS[c]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
                answer = p.stdout.strip()
                ok = number in re.sub(r"[,\s]", "", answer)
                right[c] += ok
                tokens = re.search(r"prompt: (\d+) tokens", p.stderr)
                held = re.search(r"bytes held by the cache: ([\d.]+) MiB \(peak ([\d.]+) MiB\)",
                                 p.stderr)
                row = {"sample": i, "config": c, "number": number, "depth": round(depth, 3),
                       "prompt_tokens": int(tokens.group(1)) if tokens else None,
                       "held_mib": float(held.group(1)) if held else None,
                       "peak_mib": float(held.group(2)) if held else None,
                       "right": ok, "answer": answer}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(json.dumps(row), file=sys.stderr)
    print(f"| configuration | right of {a.samples} |\n|---|---|")
    for c in configs:
        print(f"| {c} | {right[c]} |")


if __name__ == "__main__":
    main()
