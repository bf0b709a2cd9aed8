#!/usr/bin/env python3
"""Corpus for the demo model (models/gemma3-pydoc): turns the reStructuredText sources of the Python 3.11
documentation (Debian package python3.11-doc, PSF license) into plain text documents plus question/answer pairs
for a short chat fine-tune, and tokenizes both into arrays of token ids for tools/train_demo_model.py.

  extract  --src /usr/share/doc/python3.11/html/_sources --out build-demo
           writes corpus_train.txt / corpus_val.txt (documents separated by a line "\\f"), spm_input.txt (one
           paragraph per line, for spm_train), sft.jsonl ({"q", "a", "kind", "src"}) and extract.json (counts)
  encode   --out build-demo   (after spm_train wrote build-demo/tokenizer.model)
           writes train.bin / val.bin (uint16 ids: every document is <bos> text <eos>), sft_train.bin /
           sft_val.bin (uint16 ids of padded chat examples, shape [n, L]) with matching *_mask.bin (uint8: 1 where
           the token is part of the answer and is trained on), and data.json (shapes, counts)

Only the Python standard library, numpy and sentencepiece (Debian: python3-numpy, python3-sentencepiece).
The reST handling is approximate on purpose: it aims at readable prose and code as Sphinx would render them.
"""
import argparse
import hashlib
import json
import os
import random
import re
import sys

# ---- inline markup ---------------------------------------------------------------------------------------------

ROLE_RE = re.compile(r":(?:[A-Za-z0-9_-]+:)*([A-Za-z0-9_-]+):`((?:[^`\\]|\\.)+)`")
LABELS = {}  # reST label or document path -> title, filled by scan_labels() before the walk


def scan_labels(rel, lines):
    """Labels (.. _name:) placed right before a title, and the document's own title, for :ref: and :doc:."""
    first = None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and line.strip() and UNDERLINE_RE.match(lines[i + 1]) and not UNDERLINE_RE.match(line):
            first = first or line.strip()
        m = re.match(r"^\.\. _([^:]+):\s*$", line)
        if not m:
            continue
        for k in range(i + 1, min(i + 8, len(lines) - 1)):
            l = lines[k]
            if not l.strip() or re.match(r"^\.\. _[^:]+:\s*$", l):
                continue
            if UNDERLINE_RE.match(l) and k + 2 < len(lines):
                l, nxt = lines[k + 1], lines[k + 2]
            else:
                nxt = lines[k + 1]
            if UNDERLINE_RE.match(nxt) and l.strip():
                LABELS[m.group(1).lower()] = l.strip()
            break
    if first:
        LABELS[rel[:-len(".rst.txt")].lower()] = first


def _role(m):
    role, text = m.group(1), m.group(2)
    if role == "rfc":
        return "RFC " + text.split("#")[0]
    if role == "pep":
        return "PEP " + text.split("#")[0]
    if role in ("ref", "doc") and "<" not in text:
        raw = LABELS.get(text.lower().lstrip("~").lstrip("/"))
        return re.sub(r"\s+---?\s+", " \u2014 ", inline(raw)) if raw else text.rsplit("/", 1)[-1].replace("-", " ")
    t = re.match(r"^(.*?)\s*<[^<>]+>$", text, re.S)
    if t and t.group(1).strip():
        return t.group(1).strip()
    text = text.lstrip("!")
    if text.startswith("~"):
        text = text[1:].split(".")[-1]
    if role == "samp":
        text = text.replace("{", "").replace("}", "")
    if role in ("func", "meth") and not text.endswith(")"):
        text += "()"
    return text


def inline(s):
    s = ROLE_RE.sub(_role, s)
    s = re.sub(r"``(.+?)``", r"\1", s)
    s = re.sub(r"`([^`<>]+?)\s*<[^<>`]+>`__?", r"\1", s)  # `text <url>`_
    s = re.sub(r"`([^`]+?)`__?", r"\1", s)  # `text`_
    s = re.sub(r"`([^`]+?)`", r"\1", s)  # default role
    s = re.sub(r"\s*\[(?:#[\w-]*|\d+)\]_", "", s)  # footnote references
    s = s.replace("|version|", "3.11").replace("|release|", "3.11")
    s = re.sub(r"\|(\w[\w -]*)\|", r"\1", s)
    s = re.sub(r"\*\*(.+?)\*\*", r"\1", s)
    s = re.sub(r"(?<![\w*\\])\*(?![\s*])([^*\n]+?)(?<![\s\\])\*(?![\w*])", r"\1", s)
    s = s.replace("\\ ", "").replace("\\*", "*").replace("\\`", "`")
    return s


# ---- block structure -------------------------------------------------------------------------------------------

DIRECTIVE_RE = re.compile(r"^\.\.\s+([A-Za-z0-9:_-]+)::\s*(.*)$")
DROP = {"index", "toctree", "sectionauthor", "moduleauthor", "highlight", "include", "literalinclude", "image",
        "figure", "tabularcolumns", "testsetup", "testcleanup", "contents", "raw", "audit-event", "program",
        "productionlist", "availability", "sidebar", "only", "csv-table", "list-table", "table", "opcode",
        "pdbcommand", "cmdoption", "option", "envvar", "describe", "object", "role", "default-role", "impl-detail"}
ADMONITIONS = {"note": "Note", "warning": "Warning", "important": "Important", "caution": "Caution",
               "seealso": "See also", "hint": "Hint", "tip": "Tip", "attention": "Attention", "danger": "Danger",
               "topic": None, "admonition": None}
CODE = {"code-block", "sourcecode", "code", "doctest", "testcode", "testoutput", "parsed-literal"}
API = {"function", "method", "class", "data", "attribute", "exception", "decorator", "decoratormethod",
       "classmethod", "staticmethod", "coroutinefunction", "coroutinemethod", "abstractmethod", "property",
       "c:function", "c:macro", "c:type", "c:var", "c:member", "c:struct", "c:data"}
LIST_RE = re.compile(r"^(\*|-|\+|#\.|\d+\.|\(?[a-z0-9]\))\s+\S")
UNDERLINE_RE = re.compile(r"^([=\-~^*#\"'`+.:_])\1{2,}\s*$")


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def dedent(lines):
    ind = min((indent_of(l) for l in lines if l.strip()), default=0)
    return [l[ind:] if l.strip() else "" for l in lines]


def take_block(lines, i):
    """Lines after i that are blank or indented (the body of a directive or an indented block)."""
    j = i
    while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t"))):
        j += 1
    while j > i and not lines[j - 1].strip():
        j -= 1
    return lines[i:j], j


class Doc:
    """Walks one .rst file: text output plus the records the chat fine-tune is made from."""

    def __init__(self, src):
        self.src = src
        self.out = []
        self.module = None
        self.sections = []  # [title, [paragraphs]]
        self.api = []  # (kind, qualified name, paragraph)
        self.terms = []  # (term, paragraph)

    def emit(self, text=""):
        self.out.append(text)

    def para(self, lines, prose=True):
        text = " ".join(l.strip() for l in lines)
        if text.endswith("::"):
            text = text[:-2].rstrip()
            text = text + ":" if text and not text.endswith(":") else text
        text = re.sub(r"(?<=\S) {2,}", " ", inline(text).strip())
        if not text:
            return None
        self.emit(text)
        if prose and self.sections and len(self.sections[-1][1]) < 4:
            self.sections[-1][1].append(text)
        return text

    def code(self, lines):
        for l in dedent(lines):
            self.emit("    " + l if l else "")

    def walk(self, lines, qual=None, top=True, collect=None):
        """Renders a block (already dedented). collect: list receiving prose paragraphs (for API bodies)."""
        i, n = 0, len(lines)
        while i < n:
            line = lines[i]
            if not line.strip():
                self.emit("")
                i += 1
                continue
            # section title, with or without overline
            if i + 1 < n and UNDERLINE_RE.match(lines[i + 1]) and line.strip() and not line.startswith(" ") \
                    and len(lines[i + 1].strip()) >= max(3, len(line.strip()) - 2) and not UNDERLINE_RE.match(line):
                self.title(line)
                i += 2
                continue
            if UNDERLINE_RE.match(line) and i + 2 < n and UNDERLINE_RE.match(lines[i + 2]) and lines[i + 1].strip():
                self.title(lines[i + 1])
                i += 3
                continue
            if UNDERLINE_RE.match(line):  # transition
                i += 1
                continue
            m = DIRECTIVE_RE.match(line)
            if m:
                body, j = take_block(lines, i + 1)
                self.directive(m.group(1), m.group(2), dedent(body), qual, collect)
                i = j
                continue
            if line.startswith(".."):  # comment, target, substitution definition, footnote
                _, i = take_block(lines, i + 1)
                continue
            if line.startswith((" ", "\t")):  # block quote / definition body
                body, i = take_block(lines, i)
                self.walk(dedent(body), qual, top=False, collect=collect)
                continue
            # paragraph: up to a blank line (a list item also ends at the next item); a trailing '::' makes
            # the next indented block literal
            j = i + 1
            while j < n and lines[j].strip() and not DIRECTIVE_RE.match(lines[j]) and not LIST_RE.match(lines[j]):
                j += 1
            par = lines[i:j]
            literal = par[-1].rstrip().endswith("::")
            is_list = bool(LIST_RE.match(par[0])) or par[0].startswith("|") \
                or par[0].startswith("+-") or par[0].startswith("==")
            if par[0].startswith(("+-", "==")):  # tables: keep as they are
                for l in par:
                    self.emit(inline(l.rstrip()))
                i = j
                continue
            text = self.para(par, prose=top and not is_list and collect is None)
            if collect is not None and text and not is_list:
                collect.append(text)
            i = j
            if literal:
                while i < n and not lines[i].strip():
                    i += 1
                body, i = take_block(lines, i) if i < n and lines[i].startswith((" ", "\t")) else ([], i)
                if body:
                    self.emit("")
                    self.code(body)

    def title(self, line):
        t = inline(line.strip())
        t = re.sub(r"\s+---?\s+", " \u2014 ", t)
        self.emit(t)
        self.sections.append([t, []])

    def directive(self, name, args, body, qual, collect):
        opts_end = 0
        while opts_end < len(body) and body[opts_end].strip():
            opts_end += 1
        head, rest = body[:opts_end], body[opts_end:]
        head_opts = [l for l in head if re.match(r"^:[\w -]+:", l)]
        extra_sigs = [l for l in head if l not in head_opts]
        if name in ("module", "currentmodule"):
            self.module = args.strip() or None
            return
        if name in DROP and name not in ("only", "impl-detail"):
            return
        if name in ("only", "impl-detail"):
            self.walk(body, qual, top=False, collect=collect)
            return
        if name == "rubric":
            self.emit(inline(args))
            return
        if name in CODE:
            code = rest if not extra_sigs else body
            if args and name == "parsed-literal":
                code = [args] + code
            self.code([inline(l) if name == "parsed-literal" else l for l in code if not re.match(r"^:\w+:", l)])
            return
        if name in ("versionadded", "versionchanged", "deprecated", "deprecated-removed"):
            parts = args.split(None, 1)
            ver = parts[0] if parts else ""
            label = {"versionadded": "New in version %s", "versionchanged": "Changed in version %s",
                     "deprecated": "Deprecated since version %s",
                     "deprecated-removed": "Deprecated since version %s"}[name] % ver
            if name == "deprecated-removed" and len(parts) > 1:
                label += ", will be removed in version " + parts[1].split()[0]
                parts = parts[:1]
            text = " ".join([parts[1]] if len(parts) > 1 else []) + " " + " ".join(l.strip() for l in body)
            text = inline(text.strip())
            self.emit(label + (": " + text if text else "."))
            return
        if name in ADMONITIONS:
            label = ADMONITIONS[name]
            if args and label is None:
                self.emit(inline(args))
            elif label:
                self.emit(label + ":")
            self.walk(body, qual, top=False, collect=None)
            return
        if name == "glossary":
            self.glossary(rest)
            return
        if name in API:
            sigs = []
            for part in [args] + [l.strip() for l in extra_sigs]:  # a trailing backslash continues a signature
                if sigs and sigs[-1].endswith("\\"):
                    sigs[-1] = sigs[-1][:-1].rstrip() + " " + part
                else:
                    sigs.append(part)
            sigs = [re.sub(r"\s+", " ", x.rstrip("\\").strip()) for x in sigs if x.strip()] or [""]
            for s in sigs:
                self.emit(s)
            self.emit("")
            base = re.split(r"[(\s\[]", sigs[0].strip(), 1)[0]
            if name.startswith("c:"):
                cm = re.search(r"(\w+)\s*\(", sigs[0]) or re.search(r"(\w+)\s*$", sigs[0])
                qualname = cm.group(1) if cm else base
            elif "." in base or not (qual or self.module):
                qualname = base
            else:
                qualname = "%s.%s" % (qual or self.module, base)
            if qual is None and self.module and base.startswith(self.module + "."):
                qualname = base
            paras = []
            inner = qualname if name in ("class", "exception") else qual
            self.walk(rest, inner, top=False, collect=paras)
            if paras:
                self.api.append((name, qualname, paras[0]))
            return
        self.walk(body, qual, top=False, collect=collect)  # unknown directive: keep its text

    def glossary(self, lines):
        lines = dedent(lines)
        i = 0
        while i < len(lines):
            if lines[i].strip() and not lines[i].startswith(" "):
                terms = []
                while i < len(lines) and lines[i].strip() and not lines[i].startswith(" "):
                    terms.append(inline(lines[i].strip()))
                    i += 1
                body, i = take_block(lines, i)
                self.emit(", ".join(terms))
                paras = []
                self.walk(dedent(body), None, top=False, collect=paras)
                self.emit("")
                if paras:
                    self.terms.append((terms[0], paras[0]))
            else:
                i += 1


def tidy(lines):
    out, blank = [], 0
    for l in lines:
        l = l.rstrip()
        if not l:
            blank += 1
            continue
        if out and blank:
            out.append("")
        blank = 0
        out.append(l)
    return "\n".join(out)


# ---- chat examples -----------------------------------------------------------------------------------------------

def clip_answer(p, max_words=110):
    words = p.split()
    if len(words) <= max_words:
        return p
    cut = " ".join(words[:max_words])
    k = cut.rfind(". ")
    return cut[:k + 1] if k > len(cut) // 3 else None


def good_answer(p):
    return p and len(p.split()) >= 6 and not p.rstrip().endswith(":") and not p.startswith(
        ("Source code:", "Note:", "Warning:", "See also", "New in", "Changed in", "Deprecated")) and "\n" not in p


SECTION_Q = ["Tell me about {t}.", "What can you tell me about {t}?", "Explain {t}.",
             "What does the Python documentation say about {t}?", "Give me an overview of {t}."]
MODULE_Q = ["What is the {m} module?", "What does the {m} module do?", "What is {m} used for?",
            "Tell me about the {m} module."]
CALL_Q = ["What does {n}() do?", "Explain {n}().", "What is {n}() for?", "How does {n}() work?"]
CLASS_Q = ["What is the {n} class?", "What is {n}?", "Explain the {n} class."]
EXC_Q = ["When is {n} raised?", "What is the {n} exception?"]
DATA_Q = ["What is {n}?", "What does {n} hold?"]
TERM_Q = ["What is {a} {t}?", "What does \"{t}\" mean in Python?", "Define {t}."]
SKIP_TITLES = re.compile(r"^(Examples?|Notes?|Footnotes|Introduction|Overview|Summary|Functions|Classes|Constants|"
                         r"Exceptions|Module contents|Usage|Contents|Other|Changes|Acknowledgements|See also|"
                         r"Build and C API Changes|Porting to Python 3\.\d+|Deprecated|Removed|New Features|"
                         r"Other Language Changes|Optimizations|Improved Modules|New Modules)$", re.I)


def chat_pairs(doc, rnd):
    pairs = []
    for title, paras in doc.sections:
        ans = next((clip_answer(p) for p in paras[:3] if good_answer(p) and clip_answer(p)), None)
        if not ans or SKIP_TITLES.match(title) or len(title) > 90:
            continue
        mm = re.match(r"^(\S+) \u2014 (.+)$", title)
        if mm:
            q = rnd.choice(MODULE_Q).format(m=mm.group(1))
        else:
            q = rnd.choice(SECTION_Q).format(t=title)
        pairs.append({"q": q, "a": ans, "kind": "section", "src": doc.src})
    for kind, name, para in doc.api:
        ans = clip_answer(para) if good_answer(para) else None
        if not ans:
            continue
        if kind in ("class",):
            q = rnd.choice(CLASS_Q)
        elif kind == "exception":
            q = rnd.choice(EXC_Q)
        elif kind in ("data", "attribute", "property", "c:var", "c:member", "c:type", "c:struct", "c:data"):
            q = rnd.choice(DATA_Q)
        elif kind == "decorator":
            q = "What does the @{n} decorator do?"
        else:
            q = rnd.choice(CALL_Q)
            name = name.split("(")[0]
        pairs.append({"q": q.format(n=name), "a": ans, "kind": "api", "src": doc.src})
    for term, para in doc.terms:
        ans = clip_answer(para) if good_answer(para) else None
        if not ans:
            continue
        art = "an" if term[:1].lower() in "aeiou" else "a"
        pairs.append({"q": rnd.choice(TERM_Q).format(a=art, t=term), "a": ans, "kind": "term", "src": doc.src})
    return pairs


# ---- commands ----------------------------------------------------------------------------------------------------

def is_val(relpath):
    """About 4% of the documents, chosen by a hash of the path, held out for validation."""
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % 25 == 0


def cmd_extract(a):
    files = []
    for root, _, names in os.walk(a.src):
        for f in names:
            if f.endswith(".rst.txt"):
                files.append(os.path.relpath(os.path.join(root, f), a.src))
    files.sort()
    os.makedirs(a.out, exist_ok=True)
    rnd = random.Random(1234)
    train, val, pairs, counts = [], [], [], {"files": 0, "skipped": []}
    texts = {}
    for rel in files:
        with open(os.path.join(a.src, rel), encoding="utf-8") as f:
            texts[rel] = f.read().expandtabs(8).split("\n")
        scan_labels(rel, texts[rel])
    for rel in files:
        if rel.startswith("whatsnew/changelog") or rel.startswith("includes/"):
            counts["skipped"].append(rel)
            continue
        lines = texts[rel]
        doc = Doc(rel)
        doc.walk(lines)
        text = tidy(doc.out)
        if len(text) < 200:
            counts["skipped"].append(rel)
            continue
        counts["files"] += 1
        (val if is_val(rel) else train).append(text)
        for p in chat_pairs(doc, rnd):
            p["split"] = "val" if is_val(rel) else "train"
            pairs.append(p)
    sep = "\n\f\n"
    with open(os.path.join(a.out, "corpus_train.txt"), "w", encoding="utf-8") as f:
        f.write(sep.join(train))
    with open(os.path.join(a.out, "corpus_val.txt"), "w", encoding="utf-8") as f:
        f.write(sep.join(val))
    with open(os.path.join(a.out, "spm_input.txt"), "w", encoding="utf-8") as f:
        for doc in train:  # paragraphs as lines; code lines stay lines (their indentation is kept)
            for line in doc.split("\n"):
                if line.strip():
                    f.write(line + "\n")
    with open(os.path.join(a.out, "sft.jsonl"), "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    kinds = {}
    for p in pairs:
        kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    counts.update(train_docs=len(train), val_docs=len(val), train_chars=sum(map(len, train)),
                  val_chars=sum(map(len, val)), chat_pairs=len(pairs), chat_kinds=kinds,
                  chat_val=sum(p["split"] == "val" for p in pairs))
    with open(os.path.join(a.out, "extract.json"), "w") as f:
        json.dump(counts, f, indent=1)
    print(json.dumps({k: v for k, v in counts.items() if k != "skipped"}))


def chat_ids(sp, q, a):
    """Gemma turn format: <bos><start_of_turn>user\\nQ<end_of_turn>\\n<start_of_turn>model\\nA<end_of_turn>\\n.
    Returns (ids, mask) where mask marks the answer and its closing <end_of_turn>."""
    prompt = "<start_of_turn>user\n" + q.strip() + "<end_of_turn>\n<start_of_turn>model\n"
    p = [2] + sp.encode(prompt)
    ans = sp.encode(a.strip()) + [106]
    tail = sp.encode("\n")
    return p + ans + tail, [0] * len(p) + [1] * len(ans) + [0] * len(tail)


def cmd_encode(a):
    import numpy as np
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.out, "tokenizer.model"))
    assert sp.piece_to_id("<start_of_turn>") == 105 and sp.piece_to_id("<end_of_turn>") == 106, "id layout"
    assert sp.bos_id() == 2 and sp.eos_id() == 1 and sp.pad_id() == 0 and sp.unk_id() == 3, "id layout"
    info = {"vocab": sp.get_piece_size()}
    for split in ("train", "val"):
        with open(os.path.join(a.out, "corpus_%s.txt" % split), encoding="utf-8") as f:
            docs = f.read().split("\n\f\n")
        ids = []
        for d in docs:
            ids.append(2)
            ids.extend(sp.encode(d))
            ids.append(1)
        arr = np.asarray(ids, dtype=np.uint16)
        arr.tofile(os.path.join(a.out, "%s.bin" % split))
        info[split + "_tokens"] = int(arr.size)
        info[split + "_chars"] = sum(map(len, docs))
    pairs = [json.loads(l) for l in open(os.path.join(a.out, "sft.jsonl"), encoding="utf-8")]
    L = a.sft_len
    for split in ("train", "val"):
        rows, masks, dropped = [], [], 0
        for p in pairs:
            if p["split"] != split:
                continue
            ids, mask = chat_ids(sp, p["q"], p["a"])
            if len(ids) > L:
                dropped += 1
                continue
            rows.append(ids + [0] * (L - len(ids)))
            masks.append(mask + [0] * (L - len(mask)))
        np.asarray(rows, dtype=np.uint16).tofile(os.path.join(a.out, "sft_%s.bin" % split))
        np.asarray(masks, dtype=np.uint8).tofile(os.path.join(a.out, "sft_%s_mask.bin" % split))
        info["sft_%s_rows" % split] = len(rows)
        info["sft_%s_dropped_too_long" % split] = dropped
    info["sft_len"] = L
    info["chars_per_token"] = round(info["train_chars"] / info["train_tokens"], 3)
    with open(os.path.join(a.out, "data.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("--src", default="/usr/share/doc/python3.11/html/_sources")
    e.add_argument("--out", default="build-demo")
    c = sub.add_parser("encode")
    c.add_argument("--out", default="build-demo")
    c.add_argument("--sft-len", type=int, default=256)
    a = ap.parse_args()
    {"extract": cmd_extract, "encode": cmd_encode}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
