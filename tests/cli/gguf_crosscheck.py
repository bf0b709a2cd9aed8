"""Cross-checks of our GGUF block formats against the `gguf` package (llama.cpp's own Python reader and writer,
an implementation independent of ours). Used by tests/cli/run.sh.

  compare QFILE F32FILE TYPES   every quantized tensor of QFILE, dequantized by gguf-py, must equal bit for bit the
                                float32 tensor of the same name in F32FILE (our dequantization, written by
                                `gemma3 quantize --type f32`); TYPES (comma-separated) must be exactly the quantized
                                types QFILE holds
  requant F32FILE OUT TYPE      writes OUT: F32FILE's metadata and tensors, with every matrix whose rows fit TYPE's
                                blocks quantized to TYPE by gguf-py (so our loader reads bytes another encoder wrote)
Prints one line; exits non-zero on a mismatch.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def compare(qpath, fpath, want):
    q, f = tensors(qpath), tensors(fpath)
    seen, checked = {}, 0
    for name, t in q.items():
        if t.tensor_type in (QT.F32, QT.F16, QT.BF16):
            continue
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
        ours = np.asarray(f[name].data, dtype=np.float32).reshape(-1)
        if ref.shape != ours.shape:
            sys.exit(f"{name}: {ref.shape} values from gguf-py, {ours.shape} from ours")
        if not np.array_equal(ref.astype(np.float32), ours):
            i = int(np.argmax(ref != ours))
            sys.exit(f"{name} ({t.tensor_type.name}): value {i}: gguf-py {ref[i]!r}, ours {ours[i]!r}")
        seen[t.tensor_type.name] = seen.get(t.tensor_type.name, 0) + 1
        checked += t.data.size
    if sorted(seen) != sorted(want.split(",")):
        sys.exit(f"quantized types {sorted(seen)}, expected {sorted(want.split(','))}")
    print("equal:", ", ".join(f"{n} tensors of {k}" for k, n in sorted(seen.items())), f"({checked} bytes)")


def requant(src, out, tname):
    qt = QT[tname.upper()]
    block = gguf.GGML_QUANT_SIZES[qt][0]
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, arch="gemma3")
    for field in r.fields.values():
        # the reader's view of the header (version, counts) is not keys; the writer sets the architecture itself
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == VT.ARRAY else None
        w.add_key_value(field.name, field.contents(), vt, sub)
    n = 0
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.tensor_type == QT.F32 and data.ndim == 2 and data.shape[-1] % block == 0:
            w.add_tensor(t.name, gguf.quants.quantize(data, qt), raw_dtype=qt)
            n += 1
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: {n} matrices as {qt.name}")


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "requant":
        requant(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: gguf_crosscheck.py compare QFILE F32FILE TYPES | requant F32FILE OUT TYPE")
