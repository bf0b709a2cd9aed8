#!/usr/bin/env python3
"""Trains a Gemma-like SentencePiece BPE vocabulary with Debian's spm_train, for the tokenizer tests and the
benchmark (large models are not committed; this makes one in a cache folder and reuses it).

    train_vocab.py [--vocab 32768] [--mb 12] [--cache DIR] [--dummy]     prints the path of the .model file

Settings follow Gemma 3's tokenizer: BPE, byte_fallback, split_digits, identity normalization, no dummy prefix,
whitespace kept, whitespace-only pieces allowed, Gemma's low ids (pad 0, eos 1, bos 2, unk 3, <mask>,
[multimodal], <unused0..98>, <start_of_turn> 105, <end_of_turn> 106 as user-defined symbols).
--dummy trains the other normalizer variant instead: add_dummy_prefix and remove_extra_whitespaces on (the
sentencepiece defaults, still identity normalization), to check the dummy prefix and whitespace folding.
The cache key covers the settings, so a changed recipe trains afresh. Default cache: $G3_TOK_CACHE or
${TMPDIR:-/tmp}/g3-tok-cache-$UID.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    vocab, mb, dummy = 32768, 12.0, False
    cache = os.environ.get("G3_TOK_CACHE") or os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                            "g3-tok-cache-%d" % os.getuid())
    a = sys.argv[1:]
    if "--dummy" in a:
        dummy = True
        a.remove("--dummy")
    for i in range(0, len(a) - 1, 2):
        if a[i] == "--vocab":
            vocab = int(a[i + 1])
        elif a[i] == "--mb":
            mb = float(a[i + 1])
        elif a[i] == "--cache":
            cache = a[i + 1]
    spm_train = shutil.which("spm_train")
    if not spm_train:
        sys.stderr.write("train_vocab.py: spm_train not found (Debian: apt-get install sentencepiece)\n")
        sys.exit(3)
    user = ["<mask>", "[multimodal]"] + ["<unused%d>" % i for i in range(99)] + ["<start_of_turn>", "<end_of_turn>"]
    args = ["--model_type=bpe", "--vocab_size=%d" % vocab, "--byte_fallback=true", "--split_digits=true",
            "--normalization_rule_name=identity", "--remove_extra_whitespaces=false", "--add_dummy_prefix=false",
            "--allow_whitespace_only_pieces=true", "--character_coverage=0.9995", "--max_sentence_length=4192",
            "--pad_id=0", "--eos_id=1", "--bos_id=2", "--unk_id=3", "--pad_piece=<pad>", "--eos_piece=<eos>",
            "--bos_piece=<bos>", "--unk_piece=<unk>", "--user_defined_symbols=" + ",".join(user),
            "--num_threads=2", "--minloglevel=2"]
    if dummy:
        args = [x for x in args if not x.startswith(("--remove_extra", "--add_dummy"))]
        args += ["--remove_extra_whitespaces=true", "--add_dummy_prefix=true"]
    key = hashlib.sha256(("v3 %s %s" % (mb, " ".join(args))).encode()).hexdigest()[:12]
    os.makedirs(cache, exist_ok=True)
    model = os.path.join(cache, "spm%d%s-%s.model" % (vocab, "-dummy" if dummy else "", key))
    if not os.path.exists(model):
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            corpus = os.path.join(tmp, "corpus.txt")
            subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), "train", corpus, "--mb", str(mb)],
                           check=True, stdout=subprocess.DEVNULL)
            prefix = os.path.join(tmp, "m")
            r = subprocess.run([spm_train, "--input=" + corpus, "--model_prefix=" + prefix] + args,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                sys.stderr.write(r.stdout.decode("utf-8", "replace")[-3000:])
                sys.exit(1)
            os.replace(prefix + ".model", model)  # atomic: a half-written model is never seen
    print(model)


if __name__ == "__main__":
    main()
