#!/usr/bin/env python3
"""Grows a SentencePiece BPE model to Gemma's vocabulary size (262,144 pieces) by appending pieces made of two
existing pieces, with scores below all others: a stand-in for the real vocabulary when measuring load time and
encoding speed with a table that size (and one more exactness check, since the new pieces do get merged).

    grow_vocab.py MODEL OUT [--size 262144] [--seed 1]

Standard library only: serialized SentencePiece entries (field 1 of ModelProto) are appended to the file, which
protobuf reads as more elements of the repeated field.
"""
import random
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


def enc_varint(n):
    out = bytearray()
    while True:
        c = n & 0x7F
        n >>= 7
        out.append(c | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 5:
            v = struct.unpack_from("<f", b, i)[0]
            i += 4
        elif w == 1:
            v = b[i:i + 8]
            i += 8
        elif w == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            i += n
        yield f, v


def main():
    a = sys.argv[1:]
    src, dst = a[0], a[1]
    size, seed = 262144, 1
    for i in range(2, len(a) - 1, 2):
        if a[i] == "--size":
            size = int(a[i + 1])
        elif a[i] == "--seed":
            seed = int(a[i + 1])
    data = open(src, "rb").read()
    pieces, normal, low = set(), [], 0.0
    for f, v in fields(data):
        if f != 1:
            continue
        p, sc, ty = b"", 0.0, 1
        for g, w in fields(v):
            if g == 1:
                p = w
            elif g == 2:
                sc = w
            elif g == 3:
                ty = w
        pieces.add(p)
        low = min(low, sc)
        if ty == 1:
            normal.append(p)
    rng = random.Random(seed)
    extra = bytearray()
    n, score = len(pieces), low
    while n < size:
        p = rng.choice(normal) + rng.choice(normal)
        if p in pieces or len(p) > 48:
            continue
        pieces.add(p)
        score -= 1.0
        body = b"\x0a" + enc_varint(len(p)) + p + b"\x15" + struct.pack("<f", score)
        extra += b"\x0a" + enc_varint(len(body)) + body
        n += 1
    with open(dst, "wb") as f:
        f.write(data + bytes(extra))


if __name__ == "__main__":
    main()
