#!/bin/sh
# Data for the demo model (models/gemma3-pydoc): the Python 3.11 documentation from Debian's python3.11-doc
# (reStructuredText sources, PSF license) turned into plain text and chat pairs, a SentencePiece BPE vocabulary
# with Gemma 3's id layout and settings, and both tokenized for tools/train_demo_model.py.
#   usage: tools/build_demo_corpus.sh [OUT_DIR]     (default build-demo; run from the repository root)
# Needs: python3.11-doc (installed here with apt-get when missing), sentencepiece (spm_train),
# python3-sentencepiece, python3-numpy.
set -eu
OUT=${1:-build-demo}
VOCAB=${VOCAB:-8192}
SRC=/usr/share/doc/python3.11/html/_sources
PY=/usr/bin/python3   # Debian's python, which has python3-sentencepiece and python3-numpy

if [ ! -d "$SRC" ]; then
    echo "installing python3.11-doc (the corpus) with apt-get" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get install -y --no-install-recommends python3.11-doc
fi
command -v spm_train >/dev/null || { echo "spm_train not found: apt-get install sentencepiece" >&2; exit 1; }

mkdir -p "$OUT"
$PY tools/demo_corpus.py extract --src "$SRC" --out "$OUT"

# Gemma 3's id layout: pad 0, eos 1, bos 2, unk 3, <mask> 4, [multimodal] 5, <unused0..98> 6-104,
# <start_of_turn> 105, <end_of_turn> 106, byte pieces <0x00>..<0xFF> 107-362, then merges and characters.
UDS="<mask>,[multimodal]"
i=0
while [ $i -le 98 ]; do UDS="$UDS,<unused$i>"; i=$((i + 1)); done
UDS="$UDS,<start_of_turn>,<end_of_turn>"

# every printable ASCII character gets a piece of its own (coverage alone would leave '?' or '!' to bytes)
REQ=$($PY -c 'print("".join(map(chr, range(33, 127))))')
spm_train --input="$OUT/spm_input.txt" --model_prefix="$OUT/tokenizer" --model_type=bpe \
    --vocab_size="$VOCAB" --character_coverage=0.9995 --byte_fallback=true --split_digits=true \
    --allow_whitespace_only_pieces=true --normalization_rule_name=identity --remove_extra_whitespaces=false \
    --add_dummy_prefix=false --max_sentence_length=16384 --num_threads=2 --input_sentence_size=2000000 \
    --shuffle_input_sentence=true --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 \
    --pad_piece='<pad>' --eos_piece='<eos>' --bos_piece='<bos>' --unk_piece='<unk>' \
    --required_chars="$REQ" --user_defined_symbols="$UDS" > "$OUT/spm_train.log" 2>&1 || { tail -20 "$OUT/spm_train.log"; exit 1; }

$PY tools/demo_corpus.py encode --out "$OUT"

# the corpus's license (PSF License Agreement; Zero-Clause BSD for the code in it), shipped with the model
$PY - "$SRC/license.rst.txt" "$OUT/CORPUS-LICENSE.txt" <<'PY'
import re, sys
src = open(sys.argv[1], encoding="utf-8").read().replace("|release|", "3.11")
def section(title_start):
    m = re.search(r"^(" + re.escape(title_start) + r".*)\n-+\n\n\.\. parsed-literal::\n\n((?:(?: {3,}.*)?\n)+)", src, re.M)
    return m.group(1) + "\n\n" + "\n".join(l[3:] for l in m.group(2).rstrip().split("\n")) + "\n"
head = ("The demo model models/gemma3-pydoc was trained on text extracted from the Python 3.11 documentation\n"
        "(Debian package python3.11-doc). Changes made: the reStructuredText sources were converted to plain text\n"
        "(markup removed, roles and references replaced by their text) and used as training data, and question /\n"
        "answer pairs were made from section titles, API entries and their opening paragraphs.\n\n"
        "Copyright (c) 2001-2023 Python Software Foundation; All Rights Reserved.\n\n"
        "Python software and documentation are licensed under the PSF License Agreement. Starting with Python\n"
        "3.8.6, examples, recipes, and other code in the documentation are dual licensed under the PSF License\n"
        "Agreement and the Zero-Clause BSD license.\n\n")
open(sys.argv[2], "w", encoding="utf-8").write(head + section("PSF LICENSE AGREEMENT FOR PYTHON") + "\n\n" +
                                               section("ZERO-CLAUSE BSD LICENSE"))
PY

# provenance of the corpus
{
    echo "package: python3.11-doc $(dpkg-query -W -f='${Version}' python3.11-doc 2>/dev/null || echo unknown)"
    echo "source: $SRC (reStructuredText sources of the Python 3.11 documentation)"
    echo "license: PSF License Agreement (documentation); code examples also Zero-Clause BSD (see license.rst)"
    echo "sha256 of the extracted corpus:"
    sha256sum "$OUT/corpus_train.txt" "$OUT/corpus_val.txt" | sed "s|$OUT/||"
} > "$OUT/provenance.txt"
cat "$OUT/provenance.txt"
