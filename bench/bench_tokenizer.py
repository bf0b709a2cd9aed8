#!/usr/bin/env python3
"""Library side of bench_tokenizer: encode throughput of the sentencepiece library (Python binding, one thread,
one call per document, as bench_tokenizer times ours) on a record file (u32 length + bytes per document).

    bench_tokenizer.py MODEL CORPUS [ROUNDS]     prints one line per round: MB/s by wall time, MB/s by CPU time
"""
import struct
import sys
import time

import sentencepiece as spm


def main():
    model, corpus = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    sp = spm.SentencePieceProcessor(model_file=model)
    data = open(corpus, "rb").read()
    docs, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        docs.append(data[i + 4:i + 4 + n])
        i += 4 + n
    total = sum(len(d) for d in docs)
    enc = sp.encode
    for _ in range(rounds):
        t, c = time.perf_counter(), time.thread_time()
        for d in docs:
            enc(d)
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
        print("%.4f %.4f" % (total / 1e6 / wall, total / 1e6 / cpu), flush=True)


if __name__ == "__main__":
    main()
