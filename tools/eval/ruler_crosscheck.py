#!/usr/bin/env python3
"""Cross-check of qevict's RULER generator against RULER's own (issue 53, item 2).

Runs the reference generator shipped in PyPI nvidia-long-context-eval==26.3 (NVIDIA's packaging
of RULER, Apache-2.0; the wheel tools/fetch_ruler_data.sh fetched and checked) for the 13 RULER
tasks at one length, builds qevict's prompts for the same tasks (`qevict eval --prompts-only
--haystack essay`), and writes a table of what agrees and what differs: the template's first
line, the question line with the answer prefix, the needle format, the tokens to generate, the
metric and the token budget. It also writes the reference's prompts as `--dataset` files
(answer prefix and tokens to generate on every line), so they can be run through every variant:

  python3 tools/eval/ruler_crosscheck.py --qevict build/tools/qevict -m MODEL.gguf \
      --length 4096 --samples 2 --out results/eval/ruler-crosscheck-4k

The reference runs in its own venv ($QEVICT_CACHE/venvs/ruler-crosscheck: numpy, tqdm,
wonderwords, tenacity, pyyaml from PyPI) with three shims in place of heavy dependencies:
  transformers.AutoTokenizer  our tokenizer (`qevict tokenize --ids` on the GGUF), so the
                              reference fits its prompts in the same tokens as ours (without
                              the chat template: RULER's 'base' model template);
  nltk.tokenize.sent_tokenize  a split after . ? ! followed by whitespace (no punkt download);
  scipy.special.zeta           the Riemann zeta series (fwe's alpha = 2: pi^2 / 6).
Nothing of the package's code is copied here: it is run as shipped.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]
WHEEL = "nvidia_long_context_eval-26.3-py3-none-any.whl"
REPO = Path(__file__).resolve().parents[2]

SHIM_TRANSFORMERS = '''
import os, subprocess, tempfile
class _Tok:
    def __init__(self, path):
        self.path = path
    def tokenize(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(text)
        try:
            out = subprocess.run([os.environ["QEVICT_BIN"], "tokenize", "-m", self.path, "-f", f.name,
                                  "--ids", "--no-parse-special"], check=True, capture_output=True,
                                 text=True).stdout
        finally:
            os.unlink(f.name)
        return [int(x) for x in out.strip().strip("[]").split(",") if x.strip()]
    def convert_tokens_to_string(self, tokens):
        raise NotImplementedError("the cross-check shim only counts tokens")
class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, **kwargs):
        return _Tok(path)
'''
SHIM_NLTK = '''
import re
def sent_tokenize(text):
    return [s for s in re.split(r"(?<=[.?!])\\s+", text) if s]
'''
SHIM_SCIPY = '''
import math
def zeta(x):
    if x == 2:
        return math.pi ** 2 / 6
    n = 100000
    return sum(k ** -x for k in range(1, n)) + n ** (1 - x) / (x - 1)
'''


def cache_dir():
    c = os.environ.get("QEVICT_CACHE")
    return Path(c) if c else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qevict"


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def setup(out):
    """The package's sources (from the checked wheel), its venv and the shims."""
    run(["bash", str(REPO / "tools/fetch_ruler_data.sh")], stdout=subprocess.DEVNULL)
    whl = cache_dir() / "wheels" / WHEEL
    pkg = out / "pkg"
    if not (pkg / "long_context_eval/data/prepare.py").exists():
        with zipfile.ZipFile(whl) as z:
            z.extractall(pkg, [m for m in z.namelist() if m.startswith("long_context_eval/")])
    venv = cache_dir() / "venvs" / "ruler-crosscheck"
    py = venv / "bin" / "python"
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy", "tqdm",
             "wonderwords", "tenacity", "pyyaml"])
    shim = out / "shim"
    for rel, text in [("transformers/__init__.py", SHIM_TRANSFORMERS), ("nltk/__init__.py", ""),
                      ("nltk/tokenize/__init__.py", SHIM_NLTK), ("scipy/__init__.py", ""),
                      ("scipy/special/__init__.py", SHIM_SCIPY)]:
        (shim / rel).parent.mkdir(parents=True, exist_ok=True)
        (shim / rel).write_text(text)
    return pkg, venv, shim


def reference(pkg, venv, shim, args, out):
    env = dict(os.environ, PYTHONPATH=f"{shim}:{pkg}", QEVICT_BIN=str(Path(args.qevict).resolve()),
               PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    ref = out / "ref"
    for task in TASKS:
        if (ref / task / "validation.jsonl").exists():
            continue
        r = run([str(venv / "bin/python"), str(pkg / "long_context_eval/data/prepare.py"), "--save_dir",
                 str(ref), "--task", task, "--tokenizer_path", str(Path(args.model).resolve()),
                 "--tokenizer_type", "hf", "--max_seq_length", str(args.length), "--num_samples",
                 str(args.samples), "--model_template_type", "base"], env=env, capture_output=True,
                text=True)
        if not (ref / task / "validation.jsonl").exists():
            sys.exit(f"the reference generator wrote nothing for {task}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return ref


def ours(args, out):
    d = out / "ours"
    if not (d / "prompts.jsonl").exists():
        run([args.qevict, "eval", "-m", args.model, "--tasks", ",".join(TASKS), "--lengths", str(args.length),
             "--samples", str(args.samples), "--variants", "full", "--haystack", "essay", "--prompts-only",
             "--out", str(d)])
    rows = {}
    for line in open(d / "prompts.jsonl", encoding="utf-8"):
        j = json.loads(line)
        rows.setdefault(j["task"], []).append(j)
    return rows


def load_constants(pkg):
    """The reference's per-task template, answer prefix, tokens and metric, as it states them."""
    sys.path.insert(0, str(pkg))
    import importlib
    import yaml
    gen = importlib.import_module("long_context_eval.data.synthetic.constants").TASKS
    metric = {k: v["metric_fn"].__name__
              for k, v in importlib.import_module("long_context_eval.eval.synthetic.constants").TASKS.items()}
    tasks = yaml.safe_load(open(pkg / "long_context_eval/synthetic.yaml"))
    return {t: {"family": tasks[t]["task"], **gen[tasks[t]["task"]], "metric": metric[tasks[t]["task"]]}
            for t in TASKS}


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def mask(s):
    """Variable parts out: UUIDs, numbers, needle keys, variable names, the qa question."""
    s = UUID.sub("<U>", s)
    s = re.sub(r"\d+", "<N>", s)
    s = re.sub(r"(magic \w+ for ).*?( mentioned| is:)", r"\1<K>\2", s)
    s = re.sub(r"\b[A-Z]{3,5}\b", "<V>", s)
    s = re.sub(r"(Question: )(?!What are the|Find all|Do not).*", r"\1<Q>", s)
    return s


def needle_line(text):
    """The masked text around the main part's first needle or VAR statement (layout check)."""
    main = text[text.rfind("Memorize and track"):] if "Memorize and track" in text else text
    m = re.search(r"VAR [A-Z]+ = \d+|One of the special magic [^\n]*? is: \S+?\.", main)
    if not m:
        return ""
    return mask(main[max(0, m.start() - 12):m.end() + 12])


def tokens(args, text):
    out = subprocess.run([args.qevict, "tokenize", "-m", args.model, "-p", text, "--ids", "--no-parse-special"],
                         check=True, capture_output=True, text=True).stdout
    return len([x for x in out.strip().strip("[]").split(",") if x.strip()])


def compare(args, consts, ref, our_rows, out):
    lines = [f"# RULER's generator against qevict's at {args.length} tokens\n",
             f"Reference: PyPI nvidia-long-context-eval 26.3 (`{WHEEL}`), `prepare.py --model_template_type "
             "base --tokenizer_type hf` with our tokenizer shimmed in; ours: `qevict eval --prompts-only "
             f"--haystack essay`; {args.samples} sample(s) per task, model `{Path(args.model).name}`. "
             "Masked: UUIDs, numbers, needle keys, variable names, the qa question (<U> <N> <K> <V> <Q>). "
             "Reference tokens: its input in our tokenizer without a chat template (RULER's 'base'); "
             "ours: with the model's chat template and the answer prefix in the assistant turn.\n",
             "| task | first line | question + answer prefix | needle format | line around the first "
             "needle | tokens to generate | metric | prompt tokens ref / ours (+ generated ≤ length) |",
             "|---|---|---|---|---|---|---|---|"]
    dataset = out / "dataset"
    dataset.mkdir(exist_ok=True)
    for task in TASKS:
        c = consts[task]
        refs = [json.loads(line) for line in open(ref / task / "validation.jsonl", encoding="utf-8")]
        mine = our_rows.get(task, [])
        if not refs or not mine:
            lines.append(f"| {task} | – | – | – | – | – | missing ({len(refs)} ref, {len(mine)} ours) |")
            continue
        r, o = refs[0], mine[0]
        # The template's first line up to its context (fwe's context starts on that line).
        head = len(c["template"].split("\n", 1)[0].split("{context}")[0])
        def first(x):
            line = x["input"].split("\n", 1)[0]
            return mask(line)[:head + len(line) - len(line.lstrip())]
        r_first, o_first = first(r), first(o)
        # The reference's input ends with its answer prefix (prepare.py appends it to the template).
        r_last = mask(r["input"].rsplit("\n", 1)[-1])
        o_last = mask((o["input"] + " " + o["answer_prefix"]).rsplit("\n", 1)[-1])
        needle = re.compile(r"One of the special magic \w+ for .+? is: \S+?\.")
        r_need = sorted({mask(m) for m in needle.findall(r["input"])})[:2]
        o_need = sorted({mask(m) for m in needle.findall(o["input"])})[:2]
        # Layout around a needle: only where the haystack is lines (an essay's text differs).
        line_tasks = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt")
        r_line, o_line = (needle_line(r["input"]), needle_line(o["input"])) if task in line_tasks else ("", "")
        r_tok = [tokens(args, x["input"]) for x in refs]
        ref_gen = sorted({x["length"] - t for x, t in zip(refs, r_tok)})

        def agree(a, b):
            if a == b:
                return "agrees"
            if isinstance(a, str) and " ".join(a.split()) == " ".join(b.split()):
                return f"agrees but for whitespace: ref `{a[:100]!r}` / ours `{b[:100]!r}`"
            return f"differs: ref `{str(a)[:120]!r}` / ours `{str(b)[:120]!r}`"
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} / {} |".format(
            task, agree(r_first, o_first), agree(r_last, o_last),
            agree(r_need, o_need) if (r_need or o_need) else "–",
            agree(r_line, o_line) if (r_line or o_line) else "–",
            agree(c["tokens_to_generate"], o["max_new_tokens"]) + (f" (ref lengths imply {ref_gen})"
                                                                  if ref_gen != [c["tokens_to_generate"]] else ""),
            agree(c["metric"], o["metric"]),
            ", ".join(str(t) for t in r_tok), ", ".join(str(x["prompt_tokens"]) for x in mine)))
        prefix = c["answer_prefix"]
        with open(dataset / f"{task}.jsonl", "w", encoding="utf-8") as f:
            for x in refs:
                # The prefix as it ends this input (formatted with the sample's query).
                p = prefix
                if "{" in prefix:  # niah / vt: find the formatted prefix at the end of the input
                    head = prefix.split("{", 1)[0]
                    at = x["input"].rfind(head)
                    p = x["input"][at:] if at >= 0 else ""
                f.write(json.dumps({**x, "task": task, "answer_prefix": p,
                                    "tokens_to_generate": c["tokens_to_generate"]}) + "\n")
    lines.append("")
    lines.append("Run the reference's prompts through the variants (qa with string_match_part; "
                 "--dataset-length: the reference fills some tasks well short of the length, so the "
                 "cells' length is given rather than taken from the lines):\n")
    lines.append(f"    qevict eval -m MODEL --dataset-length {args.length} " + " ".join(f"--dataset {dataset}/{t}.jsonl" for t in TASKS[:11])
                 + " --variants ... --out DIR")
    lines.append(f"    qevict eval -m MODEL --dataset-length {args.length} --dataset-metric part " +
                 " ".join(f"--dataset {dataset}/{t}.jsonl" for t in TASKS[11:]) + " --variants ... --out DIR_QA")
    (out / "crosscheck.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qevict", default=str(REPO / "build/tools/qevict"))
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pkg, venv, shim = setup(out)
    ref = reference(pkg, venv, shim, args, out)
    sys.path.insert(0, str(venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"))
    compare(args, load_constants(pkg), ref, ours(args, out), out)


if __name__ == "__main__":
    main()
