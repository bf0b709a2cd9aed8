#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json for a SentencePiece BPE tokenizer.model, in the layout HF's Gemma converter
produces (model BPE with vocab + merges, byte_fallback, Replace ' '->'▁' normalizer, no pre-tokenizer, added
tokens for the special pieces), so that the tokenizer.json loader can be checked against tokenizer.model.

    make_hfjson.py MODEL OUT [--merges strings|pairs] [--special-ids 0-106] [--prepend]

Merges follow transformers' SentencePieceExtractor: for every piece, every split into two pieces of the vocab,
ordered by the merged piece's score (highest first). --prepend adds a Prepend('▁') normalizer (dummy prefix).
Standard library only: the protobuf is read by hand (ModelProto field 1 = pieces {1 piece, 2 score, 3 type}).
"""
import json
import struct
import sys


def varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v = b[i:i + 8]
            i += 8
        elif w == 5:
            v = struct.unpack_from("<f", b, i)[0]
            i += 4
        elif w == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d" % w)
        yield f, v


def main():
    a = sys.argv[1:]
    if len(a) < 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    model, out = a[0], a[1]
    fmt, special_lo, special_hi, prepend = "strings", None, None, False
    i = 2
    while i < len(a):
        if a[i] == "--merges":
            fmt = a[i + 1]
            i += 2
        elif a[i] == "--special-ids":
            lo, hi = a[i + 1].split("-")
            special_lo, special_hi = int(lo), int(hi)
            i += 2
        elif a[i] == "--prepend":
            prepend = True
            i += 1
        else:
            sys.exit("unknown option " + a[i])
    pieces = []  # (text, score, type)
    for f, v in fields(open(model, "rb").read()):
        if f == 1:
            p, sc, ty = None, 0.0, 1
            for g, w in fields(v):
                if g == 1:
                    p = w.decode("utf-8")
                elif g == 2:
                    sc = w
                elif g == 3:
                    ty = w
            pieces.append((p, sc, ty))
    vocab = {p: i for i, (p, sc, ty) in enumerate(pieces)}
    merges = []
    for p, sc, ty in pieces:
        local = []
        for k in range(1, len(p)):
            l, r = p[:k], p[k:]
            if l in vocab and r in vocab:
                local.append((l, r, sc))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2], reverse=True)  # stable: ties keep vocabulary order
    unk = next(p for p, sc, ty in pieces if ty == 2)
    added = []
    for i, (p, sc, ty) in enumerate(pieces):
        special = ty in (2, 3, 4) if special_lo is None else special_lo <= i <= special_hi
        if ty in (2, 3, 4) or special:
            added.append({"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": bool(special)})
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, replace]}
                  if prepend else replace)
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab,
                  "merges": [[l, r] for l, r, _ in merges] if fmt == "pairs" else ["%s %s" % (l, r) for l, r, _ in merges]},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
