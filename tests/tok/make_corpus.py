#!/usr/bin/env python3
"""Deterministic test text for the tokenizer: a few MB of varied documents written as records
(u32 little-endian length + bytes), or as plain lines for spm_train.

    make_corpus.py records OUT [--mb 4] [--seed 1]     varied documents (see KINDS below)
    make_corpus.py train OUT [--mb 12] [--seed 1]      prose + source lines for spm_train (valid UTF-8)

Sources: prose from /usr/share/common-licenses and /usr/share/doc (gzip read), C source from /usr/include, and
generated text: CJK, kana, Hangul, emoji (ZWJ sequences, skin tones, flags), combining marks, Arabic, Devanagari,
Thai, whitespace runs, tabs, CR/LF mixes, control characters, invalid UTF-8 (stray continuation bytes, truncated
and overlong sequences, surrogates, bytes F5..FF), and Gemma's markup markers typed as text.
Only the standard library is used.
"""
import gzip
import os
import random
import struct
import sys


def read_text(path, limit=1 << 20):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                b = f.read(limit)
        else:
            with open(path, "rb") as f:
                b = f.read(limit)
    except (OSError, EOFError):
        return None
    if b"\x00" in b[:4096]:
        return None  # binary
    return b


def gather(roots, exts, budget, rng):
    files = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                p = os.path.join(dirpath, fn)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                if exts and not any(fn.endswith(e) or e == "*" for e in exts):
                    continue
                files.append(p)
    rng.shuffle(files)
    out, total = [], 0
    for p in files:
        b = read_text(p, 256 << 10)
        if not b:
            continue
        out.append(b)
        total += len(b)
        if total >= budget:
            break
    return out


def chars(rng, ranges, n):
    s = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        s.append(chr(rng.randint(lo, hi)))
    return "".join(s)


CJK = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3000, 0x303F), (0xFF01, 0xFF5E)]
SCRIPTS = [(0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x0400, 0x04FF), (0x0370, 0x03FF),
           (0x0590, 0x05FF), (0x10A0, 0x10FF), (0x1E00, 0x1EFF)]
EMOJI = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x2600, 0x27BF)]
MARKERS = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]",
           "<unused0>", "<unused5>", "<unused98>", "<unused99>", "<start_of", "end_of_turn>", "<<start_of_turn>>",
           "<0x41>", "<start_of_image>"]


def gen_unicode(rng, n):
    parts = []
    while sum(len(p) for p in parts) < n:
        k = rng.randrange(9)
        if k == 0:
            parts.append(chars(rng, CJK, rng.randint(1, 60)))
        elif k == 1:
            parts.append(chars(rng, SCRIPTS, rng.randint(1, 60)))
        elif k == 2:  # emoji with skin tones, ZWJ sequences, variation selectors, flags
            e = chars(rng, EMOJI, 1)
            r = rng.random()
            if r < 0.3:
                e += chr(rng.randint(0x1F3FB, 0x1F3FF))
            elif r < 0.5:
                e += "\u200d" + chars(rng, EMOJI, 1) + "\ufe0f"
            elif r < 0.6:
                e = chr(0x1F1E6 + rng.randrange(26)) + chr(0x1F1E6 + rng.randrange(26))
            parts.append(e)
        elif k == 3:  # combining marks stacked on letters
            parts.append("".join(rng.choice("aeiounAEIOU") + chars(rng, [(0x0300, 0x036F)], rng.randint(1, 4))
                                 for _ in range(rng.randint(1, 10))))
        elif k == 4:  # whitespace runs
            parts.append(rng.choice([" " * rng.randint(1, 40), "\t" * rng.randint(1, 8), "\n" * rng.randint(1, 6),
                                     "\r\n", " \t \n", "\u00a0", "\u3000", "\u2003 ", "\x0b\x0c"]))
        elif k == 5:  # control characters
            parts.append("".join(chr(rng.choice(list(range(0, 32)) + [127] + list(range(0x80, 0xA0))))
                                 for _ in range(rng.randint(1, 5))))
        elif k == 6:
            parts.append(rng.choice(MARKERS))
        elif k == 7:  # digits and numbers
            parts.append(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 15))), "%.6f" % rng.random(),
                                     "0x%x" % rng.getrandbits(32), "1,234,567.89"]))
        else:
            parts.append(rng.choice(["the ", "and ", "of ", "Hello, world! ", "tokenizer ", "naïve café ",
                                     "über ", "Straße ", "“quoted” ", "— ", "… "]))
    return "".join(parts).encode("utf-8", "surrogatepass")


BAD = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
       b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff",
       b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xe2\x96"]


def corrupt(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(b) + 1)
        ins = rng.choice(BAD) if rng.random() < 0.7 else bytes([rng.randint(0x80, 0xFF)])
        b[pos:pos] = ins
    return bytes(b)


def records(out, mb, seed):
    rng = random.Random(seed)
    budget = int(mb * (1 << 20))
    prose = gather(["/usr/share/common-licenses", "/usr/share/doc"], [], budget // 2, rng)
    code = gather(["/usr/include"], [".h"], budget // 3, rng)
    docs, total = [], 0
    while total < budget:
        k = rng.random()
        if k < 0.45 and prose:
            src = rng.choice(prose)
        elif k < 0.75 and code:
            src = rng.choice(code)
        else:
            src = gen_unicode(rng, rng.randint(10, 4000))
        n = min(len(src), rng.choice([rng.randint(1, 80), rng.randint(80, 2000), rng.randint(2000, 40000)]))
        start = rng.randrange(len(src) - n + 1)
        doc = src[start:start + n]
        if rng.random() < 0.1:
            doc = corrupt(rng, doc)
        docs.append(doc)
        total += len(doc)
    with open(out, "wb") as f:
        for d in docs:
            f.write(struct.pack("<I", len(d)))
            f.write(d)
    print("%d records, %d bytes" % (len(docs), total))


def train(out, mb, seed):
    rng = random.Random(seed)
    budget = int(mb * (1 << 20))
    prose = gather(["/usr/share/common-licenses", "/usr/share/doc"], [], budget * 2 // 3, rng)
    code = gather(["/usr/include"], [".h"], budget // 3, rng)
    total = 0
    with open(out, "wb") as f:
        for b in prose + code + [gen_unicode(rng, 30000)]:
            t = b.decode("utf-8", "replace")
            for line in t.split("\n"):
                if 0 < len(line) < 2000:
                    f.write(line.encode("utf-8") + b"\n")
                    total += len(line) + 1
    print("%d bytes of training text" % total)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("records", "train"):
        sys.stderr.write(__doc__)
        sys.exit(2)
    mode, out = sys.argv[1], sys.argv[2]
    mb = 4.0 if mode == "records" else 12.0
    seed = 1
    a = sys.argv[3:]
    for i in range(0, len(a) - 1, 2):
        if a[i] == "--mb":
            mb = float(a[i + 1])
        elif a[i] == "--seed":
            seed = int(a[i + 1])
    (records if mode == "records" else train)(out, mb, seed)


if __name__ == "__main__":
    main()
