"""Shared by tools/make_test_models.py and tools/train_demo_model.py: the Gemma 3 tokenizer/chat files of a
Hugging Face folder, and reference outputs of a transformers model in the schema of the fixtures' reference.json
(see tests/data/README.md): prompt logits, greedy continuations with their margins, decode-step logits, what
transformers made of config.json (hf_view), self-checks, and tokenizer cases. Runs where PyTorch and transformers
are installed (the device machine); torch is imported inside the functions that need it.
"""
import json
import os

# Gemma 3's chat template, as released in google/gemma-3-*-it tokenizer_config.json.
GEMMA_CHAT_TEMPLATE = (
    '{{ bos_token }}\n'
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    '    {%- else -%}\n'
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    '    {%- endif -%}\n'
    '    {%- set loop_messages = messages[1:] -%}\n'
    '{%- else -%}\n'
    '    {%- set first_user_prefix = "" -%}\n'
    '    {%- set loop_messages = messages -%}\n'
    '{%- endif -%}\n'
    '{%- for message in loop_messages -%}\n'
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    '    {%- endif -%}\n'
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    '    {%- else -%}\n'
    "        {%- set role = message['role'] -%}\n"
    '    {%- endif -%}\n'
    '    {{ \'<start_of_turn>\' + role + \'\\n\' + (first_user_prefix if loop.first else "") }}\n'
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    '            {%- endif -%}\n'
    '        {%- endfor -%}\n'
    '    {%- else -%}\n'
    '        {{ raise_exception("Invalid content type") }}\n'
    '    {%- endif -%}\n'
    "    {{ '<end_of_turn>\\n' }}\n"
    '{%- endfor -%}\n'
    '{%- if add_generation_prompt -%}\n'
    "    {{'<start_of_turn>model\\n'}}\n"
    '{%- endif -%}\n'
)

# Strings whose SentencePiece encodings go into reference.json (tokenizer.cases).
TOKENIZER_CASES = [
    'Hello world',
    ' Hello world',
    '  two leading spaces',
    'multiple    spaces   inside',
    'trailing spaces   ',
    'line one\nline two\n\nline four',
    '\n\n\n',
    'Tabs\tand\ttabs',
    'windows\r\nnewline',
    'Digits: 1234567890 and 3.14159',
    'Year 2026, 007, 1,000,000',
    '0.5 + 0.25 = 0.75',
    'Unicode: caf\xe9 na\xefve r\xe9sum\xe9',
    'Mixed: \u03b1\u03b2\u03b3 \u0394\u03a3\u03a9 \xe4 \xf6 \xfc \xdf',
    '\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5',
    '\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!',
    '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645',
    'Emoji: \U0001f600\U0001f389\U0001f44d\U0001f3fd \U0001f916',
    '\xa0non-breaking\xa0space',
    "Don't stop; it's fine\u2014really\u2026",
    'email@example.com https://www.example.org/path?x=1&y=2',
    'CamelCaseIdentifier snake_case_identifier',
    'a',
    ' ',
    '',
    'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
    'The GNU General Public License is a free, copyleft license for software and other kinds of works.',
    'THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"',
    '<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n',
    'text<end_of_turn>more<start_of_turn>',
    '<bos> and <eos> as literal text',
    '<unused5><mask>',
]

CHAT_MESSAGES = [{'role': 'system', 'content': 'You are terse.'}, {'role': 'user', 'content': 'Hi there!'}, {'role': 'assistant', 'content': 'Hello.'}, {'role': 'user', 'content': 'Count to 3, please.'}]

SPECIAL_TOKENS_MAP = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}


def tokenizer_config(sp, model_max_length):
    """tokenizer_config.json as released for Gemma 3 (GemmaTokenizer), ids 0-106 marked special."""
    added = {}
    for i in range(107):
        added[str(i)] = {"content": sp.id_to_piece(i), "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
    return {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added, "bos_token": "<bos>",
            "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": GEMMA_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False, "model_max_length": model_max_length, "sp_model_kwargs": {},
            "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer",
            "use_default_system_prompt": False}


GENERATION_CONFIG = {"bos_token_id": 2, "cache_implementation": "hybrid", "do_sample": True, "eos_token_id": [1, 106],
                     "pad_token_id": 0, "top_k": 64, "top_p": 0.95, "transformers_version": "4.50.0.dev0"}


def write_tokenizer_files(folder, tokenizer_model, model_max_length):
    """Copies tokenizer.model and writes tokenizer_config.json, special_tokens_map.json, generation_config.json."""
    import shutil

    import sentencepiece as spm
    shutil.copyfile(tokenizer_model, os.path.join(folder, "tokenizer.model"))
    sp = spm.SentencePieceProcessor(model_file=tokenizer_model)
    write_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_config(sp, model_max_length))
    write_json(os.path.join(folder, "special_tokens_map.json"), SPECIAL_TOKENS_MAP)
    write_json(os.path.join(folder, "generation_config.json"), GENERATION_CONFIG)
    return sp


def write_json(path, obj, compact=False):
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, separators=(",", ":"), allow_nan=False)
        else:
            json.dump(obj, f, indent=2)
            f.write("\n")


def render_chat(messages, add_generation_prompt=True):
    """The chat template rendered with jinja2, as transformers' apply_chat_template does (bos_token '<bos>')."""
    import jinja2

    def raise_exception(msg):
        raise ValueError(msg)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(GEMMA_CHAT_TEMPLATE).render(messages=messages, bos_token="<bos>",
                                                       add_generation_prompt=add_generation_prompt)


def chat_ids(sp, messages):
    text = render_chat(messages)
    assert text.startswith("<bos>")
    return [2] + sp.encode(text[len("<bos>"):]), text[len("<bos>"):]


def tokenizer_section(sp):
    """tokenizer.{encode_options, cases, chat} as in the fixtures."""
    cases = []
    for t in TOKENIZER_CASES:
        ids = sp.encode(t)
        cases.append({"text": t, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids], "decoded": sp.decode(ids),
                      "has_user_defined_symbol": any(4 <= i <= 106 for i in ids)})
    ids, rendered = chat_ids(sp, CHAT_MESSAGES)
    return {"encode_options": "sentencepiece encode(text): no BOS/EOS added, user-defined symbols (<start_of_turn>, "
                              "<end_of_turn>, <unusedN>, <mask>) matched atomically, control tokens (<bos>, <eos>, "
                              "<pad>) are NOT parsed from text",
            "cases": cases,
            "chat": {"messages": CHAT_MESSAGES, "add_generation_prompt": True, "rendered_without_bos": rendered,
                     "ids": ids}}


# ---- reference outputs ------------------------------------------------------------------------------------------

def floats(t):
    """float32 values as Python floats printed with at most 9 significant digits (they round-trip exactly)."""
    import numpy as np
    a = np.asarray(t.detach().to("cpu").float().numpy(), dtype=np.float32).reshape(-1)
    return [float("%.9g" % v) for v in a.tolist()]


def rows(t):
    return [floats(r) for r in t]


def greedy(model, ids, n):
    """HF generate, greedy, EOS disabled so that exactly n tokens come: (tokens, per-step logits [n, V])."""
    import torch
    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    gc.top_k = None
    gc.top_p = None
    gc.temperature = None
    x = torch.tensor([ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    toks = out.sequences[0, len(ids):].tolist()
    if len(toks) != n:
        raise RuntimeError("generate gave %d tokens, wanted %d" % (len(toks), n))
    return toks, torch.stack([l[0] for l in out.logits]).float()


def margins_of(step_logits, toks):
    import torch
    top2 = torch.topk(step_logits, 2, dim=-1)
    am = top2.indices[:, 0].tolist()
    return (top2.values[:, 0] - top2.values[:, 1]).tolist(), sum(a != t for a, t in zip(am, toks))


def prompt_reference(model, kind, ids, n_gen=32, want_all=False, want_steps=False):
    """One prompts[] entry plus its check figures."""
    import torch
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        toks, step = greedy(model, ids, n_gen)
        margins, argmax_mismatch = margins_of(step, toks)
        nc = model(input_ids=torch.tensor([ids + toks[:-1]]), use_cache=False).logits[0].float()
        nc_steps = nc[len(ids) - 1:]
    entry = {"kind": kind, "ids": ids, "n_prompt": len(ids), "generated_ids": toks,
             "margins": [float("%.9g" % m) for m in margins], "last_prompt_logits": floats(full[-1])}
    if want_all:
        entry["all_prompt_logits"] = rows(full)
    if want_steps:
        entry["generated_step_logits"] = rows(step)
    check = {"generate_vs_nocache_logits_max_abs": float((step - nc_steps).abs().max()),
             "generate_vs_nocache_tokens_equal": nc_steps.argmax(-1).tolist() == toks,
             "step0_vs_prompt_last_max_abs": float((step[0] - full[-1]).abs().max()),
             "generate_argmax_mismatches": argmax_mismatch}
    return entry, check, full


def hf_view(model):
    """What transformers made of config.json."""
    import torch
    cfg = model.config
    rot = model.model.rotary_emb
    inv = {}
    for name, buf in rot.named_buffers():
        if name.endswith("_inv_freq") and "original" not in name:
            v = buf.float()
            inv["model.rotary_emb." + name] = floats(torch.stack([v[0], v[len(v) // 2], v[-1]]))
    layers = model.model.layers
    return {"config_class": type(cfg).__name__, "layer_types": list(cfg.layer_types),
            "rope_parameters": cfg.rope_parameters, "sliding_window": cfg.sliding_window,
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar, "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps, "attn_logit_softcapping": cfg.attn_logit_softcapping,
            "final_logit_softcapping": cfg.final_logit_softcapping,
            "tie_word_embeddings": getattr(cfg, "tie_word_embeddings", None),
            "lm_head_tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
            "embed_scale": float(model.model.embed_tokens.embed_scale), "inv_freq_buffers": inv,
            "attn_scaling_per_layer": [float("%.9g" % l.self_attn.scaling) for l in layers],
            "sliding_per_layer": [bool(l.self_attn.is_sliding) for l in layers]}


def produced_with(compute):
    import torch
    import transformers
    return {"transformers": transformers.__version__, "torch": torch.__version__, "compute": compute,
            "attn_implementation": "eager", "n_gen": 32,
            "greedy": "HF generate(do_sample=False, max_new_tokens=32), EOS disabled (generation_config.eos_token_id"
                      " = None) so exactly 32 tokens"}
