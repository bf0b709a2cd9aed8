#!/usr/bin/env python3
"""Compares float32 logit dumps of g3cuda_bench --dump (rows of VOCAB values): max |a - b|, the largest |a|, and the
share of rows whose greedy pick agrees.  usage: logits_diff.py VOCAB A B [C D ...] (each file against the first)"""
import sys

import numpy as np

vocab = int(sys.argv[1])
ref = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, vocab)
print(f"{sys.argv[2]}: {ref.shape[0]} rows, max |logit| {np.abs(ref).max():.4f}")
for f in sys.argv[3:]:
    x = np.fromfile(f, dtype=np.float32).reshape(-1, vocab)
    print(f"{f}: max |diff| {np.abs(x - ref).max():.3e}, mean |diff| {np.abs(x - ref).mean():.3e}, "
          f"argmax agrees {(x.argmax(1) == ref.argmax(1)).mean():.4f}")
