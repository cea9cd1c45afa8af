#!/usr/bin/env python3
"""Writes a copy of a GGUF file with every tensor dequantized to F32 (metadata unchanged),
using gguf-py's own dequantizers — an implementation independent of ours.

Why: llama.cpp quantizes activations to 8 bits inside its Q4_1/Q8_0 matmuls, which moves its
logits away from the exact product of the stored weights (measured on SmolLM2-135M Q4_1:
mean KL 4.8e-3 against a float64 forward pass, top-1 agreement 95.7 %). With F32 weights it
computes in f32, so its logits become a reference for the exact function of those weights,
which is what qevict computes from the quantized file. See tools/golden/make_model_golden.py.

    $python tools/golden/dequantize_gguf.py IN.gguf OUT.f32.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1:]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    w.add_key_value("general.file_type", 0, GGUFValueType.UINT32)  # LLAMA_FTYPE_ALL_F32
    for t in r.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = [int(x) for x in reversed([int(d) for d in t.shape])]
        w.add_tensor(t.name, a.reshape(shape), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(dst)


if __name__ == "__main__":
    main()
