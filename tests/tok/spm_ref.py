#!/usr/bin/env python3
"""Reference ids and texts from the sentencepiece library, for the tokenizer tests and the benchmark.

    spm_ref.py encode MODEL IN OUT    IN: records (u32 length + bytes); OUT: per record u32 count + count x i32 ids
    spm_ref.py decode MODEL IN OUT    IN: records of ids (u32 count + i32s); OUT: records of UTF-8 text
    spm_ref.py info MODEL             prints vocab size and normalizer settings

All integers are little-endian. Exits 3 with a message when the sentencepiece module is missing.
"""
import struct
import sys

try:
    import sentencepiece as spm
except ImportError:
    sys.stderr.write("spm_ref.py: the Python module 'sentencepiece' is missing "
                     "(Debian: apt-get install python3-sentencepiece)\n")
    sys.exit(3)


def read_records(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        out.append(data[i:i + n])
        i += n
    return out


def read_id_records(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        out.append(list(struct.unpack_from("<%di" % n, data, i)))
        i += 4 * n
    return out


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    mode, model = sys.argv[1], sys.argv[2]
    sp = spm.SentencePieceProcessor(model_file=model)
    if mode == "info":
        print(sp.get_piece_size())
        return
    src, dst = sys.argv[3], sys.argv[4]
    with open(dst, "wb") as f:
        if mode == "encode":
            for text in read_records(src):
                ids = sp.encode(text)  # bytes in: invalid UTF-8 reaches the library as is
                f.write(struct.pack("<I", len(ids)))
                f.write(struct.pack("<%di" % len(ids), *ids))
        elif mode == "decode":
            for ids in read_id_records(src):
                b = sp.decode(ids).encode("utf-8")
                f.write(struct.pack("<I", len(b)))
                f.write(b)
        else:
            sys.stderr.write("spm_ref.py: unknown mode %r\n" % mode)
            sys.exit(2)


if __name__ == "__main__":
    main()
