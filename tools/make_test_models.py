#!/usr/bin/env python3
"""Generator of the project's own tiny random-weight Gemma 3 test models and their transformers references
(tests/data/t-gqa, t-softcap, t-mm; see tests/data/README.md). Runs where PyTorch and transformers exist (the
device machine); transformers' Gemma3ForCausalLM computes the references in float32 on the CPU with eager
attention, from the bf16 weights it wrote.

  python3 tools/make_test_models.py --out tests/data --tokenizer DIR_WITH/tokenizer.model [--seed 1234]

Each model exercises something:
  t-gqa      legacy (transformers 4.50) config.json like gemma-3-1b-it: sliding_window_pattern 3, window 8,
             query_pre_attn_scalar 24 != head_dim 16, GQA 4/2, linear rope x8 on global layers
  t-softcap  config.json as transformers 5 writes it: rope_parameters per layer type (global theta 5e5 with linear
             x4, local theta 2e4), explicit layer_types that no pattern gives, final_logit_softcapping 30,
             MQA 2/1 with head_dim 32
  t-mm       Gemma3ForConditionalGeneration layout: text_config nesting that leaves most fields to transformers'
             defaults (pattern 6, query_pre_attn_scalar 256, rope thetas), tensors named language_model.model.*,
             two safetensors shards with model.safetensors.index.json, and vision tensors (F32, F64) to ignore
"""
import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as H  # noqa: E402

PROMPT_TEXT = {
    "text_short": "Once upon",
    "chat": "May I share copies of it?",
    "text_40": "The ferry left the harbour at dawn, carrying forty passengers, three bicycles and a crate of "
               "oranges bound for the market on the far side of the bay, where the fishermen were already mending "
               "their nets.",
    "text_100": "In 1923 the observatory on the hill recorded 214 clear nights, the most since it opened. The "
                "director wrote that the new 60-inch mirror, ground by hand over 18 months, had finally repaid its "
                "cost of 9,750 pounds. Students came from 6 universities to measure double stars, and one of them "
                "found a faint comet on 3 March that was later named after the town. Its orbit, computed with "
                "logarithm tables and a great deal of patience, brought it back 76 years later, exactly as "
                "predicted, to the delight of everyone who still remembered the story.",
}
LENGTHS = {"text_40": 40, "text_100": 100}

BASE = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": None, "hidden_activation": "gelu_pytorch_tanh", "initializer_range": 0.02,
        "max_position_embeddings": 1024, "model_type": "gemma3_text", "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 512}


def t_gqa_config():
    c = dict(BASE)
    c.update(head_dim=16, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=6,
             num_key_value_heads=2, query_pre_attn_scalar=24, rope_local_base_freq=10000.0,
             rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_theta=1000000.0, sliding_window=8,
             sliding_window_pattern=3)
    return dict(sorted(c.items()))


def t_softcap_config(folder):
    """Made by transformers itself, so config.json is in the installed version's own format."""
    from transformers import Gemma3TextConfig
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                           "full_attention"],
              final_logit_softcapping=30.0, max_position_embeddings=1024, eos_token_id=[1, 106], bos_token_id=2,
              pad_token_id=0)
    rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}
    try:
        cfg = Gemma3TextConfig(rope_parameters=rope, **kw)
        style = "rope_parameters"
    except Exception as e:  # an older transformers: legacy keys
        print("rope_parameters not accepted (%s); legacy keys" % e)
        cfg = Gemma3TextConfig(rope_theta=500000.0, rope_local_base_freq=20000.0,
                               rope_scaling={"rope_type": "linear", "factor": 4.0}, **kw)
        style = "legacy"
    cfg.architectures = ["Gemma3ForCausalLM"]
    cfg.save_pretrained(folder)
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f), style


def t_mm_text_config():
    """Only what differs from transformers' Gemma3TextConfig defaults, as in gemma-3-4b-it's text_config."""
    return {"head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "model_type": "gemma3_text",
            "num_attention_heads": 4, "num_hidden_layers": 7, "num_key_value_heads": 4,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 8, "vocab_size": 512}


def t_mm_config(text_config):
    return {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
            "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
            "initializer_range": 0.02, "mm_tokens_per_image": 4, "model_type": "gemma3",
            "text_config": text_config, "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
            "vision_config": {"hidden_size": 32, "image_size": 28, "intermediate_size": 64,
                              "model_type": "siglip_vision_model", "num_attention_heads": 2,
                              "num_hidden_layers": 1, "patch_size": 14, "vision_use_head": False}}


# What our engine assumes where a text_config is silent (src/model/config.c); checked against transformers.
ENGINE_DEFAULTS = {"query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "final_logit_softcapping": None}


def init_weights(model, seed, init):
    """The fixtures' scheme: projections N(0, 1/sqrt(fan_in)), norms N(0, 0.3) (q_norm N(0.5, 0.3)), embeddings
    N(0, c/sqrt(hidden)), final norm N(-1, 5) so that 1+w has zero mean. Then rounded to bf16."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "lm_head.weight":
                continue
            if name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=g) * (init["embed_rms_c"] / hidden ** 0.5)
            elif name == "model.norm.weight":
                v = torch.randn(p.shape, generator=g) * init["final_norm_std"] + init["final_norm_mean"]
            elif name.endswith("q_norm.weight"):
                v = torch.randn(p.shape, generator=g) * 0.3 + 0.5
            elif "norm" in name:
                v = torch.randn(p.shape, generator=g) * 0.3
            else:
                v = torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
            p.copy_(v.to(torch.bfloat16).float())


def quick_score(model, prompts):
    """Margins and variety of greedy decoding, to pick a seed whose references are robust to compare against."""
    ok, n, distinct, repeats = 0, 0, 99, 0
    for ids in prompts.values():
        toks, step = H.greedy(model, ids, 32)
        m, _ = H.margins_of(step, toks)
        ok += sum(x > 0.05 for x in m)
        n += len(m)
        distinct = min(distinct, len(set(toks)))
        repeats += sum(a == b for a, b in zip(toks, toks[1:]))
    return {"frac_margin_ok": ok / n, "frac_repeat": repeats / n, "min_distinct": distinct}


def make_prompts(sp):
    p = {}
    for kind, text in PROMPT_TEXT.items():
        if kind == "chat":
            p[kind] = H.chat_ids(sp, [{"role": "user", "content": text}])[0]
        else:
            ids = [2] + sp.encode(text)
            if kind in LENGTHS:
                assert len(ids) >= LENGTHS[kind], (kind, len(ids))
                ids = ids[:LENGTHS[kind]]
            p[kind] = ids
    return p


def bf16_state(model):
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
            if k != "lm_head.weight"}


def save_single(folder, state):
    from safetensors.torch import save_file
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def save_mm_shards(folder, state):
    """language_model.model.* names in two shards, plus vision tensors the engine must ignore."""
    from safetensors.torch import save_file
    named = {"language_model." + k: v for k, v in state.items()}
    g = torch.Generator().manual_seed(7)
    extra = {"vision_tower.vision_model.embeddings.patch_embedding.weight": torch.randn(32, 3, 14, 14, generator=g),
             "multi_modal_projector.mm_input_projection_weight": torch.randn(32, 64, generator=g).double()}
    keys = sorted(named)
    half = len(keys) // 2
    shard1 = {k: named[k] for k in keys[:half]}
    shard2 = {k: named[k] for k in keys[half:]}
    shard2.update(extra)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map, total = {}, 0
    for fname, sh in zip(files, (shard1, shard2)):
        save_file(sh, os.path.join(folder, fname), metadata={"format": "pt"})
        for k, v in sh.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    H.write_json(os.path.join(folder, "model.safetensors.index.json"),
                 {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    return extra


def load_mm_back(folder):
    from safetensors.torch import load_file
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fname in files:
        for k, v in load_file(os.path.join(folder, fname)).items():
            if k.startswith("language_model."):
                out[k[len("language_model."):]] = v
    return out


def build(name, out_dir, sp, tok_path, seed, log):
    from transformers import AutoConfig, Gemma3ForCausalLM
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    notes = []
    file_config = None
    if name == "t-gqa":
        file_config = t_gqa_config()
        H.write_json(os.path.join(folder, "config.json"), file_config)
        cfg = AutoConfig.from_pretrained(folder)
    elif name == "t-softcap":
        file_config, style = t_softcap_config(folder)
        notes.append("config.json written by transformers %s itself (rope style: %s)" % (
            __import__("transformers").__version__, style))
        cfg = AutoConfig.from_pretrained(folder)
    else:
        tc = t_mm_text_config()
        for attempt in range(2):
            file_config = t_mm_config(tc)
            H.write_json(os.path.join(folder, "config.json"), file_config)
            cfg = AutoConfig.from_pretrained(folder).text_config
            want_global = [(i + 1) % 6 == 0 for i in range(cfg.num_hidden_layers)]
            diffs = {k: getattr(cfg, k) for k, v in ENGINE_DEFAULTS.items() if getattr(cfg, k) != v}
            rp = cfg.rope_parameters
            if [t == "full_attention" for t in cfg.layer_types] != want_global:
                diffs["layer_types"] = cfg.layer_types
            if rp["full_attention"].get("rope_theta") != 1e6 or rp["sliding_attention"].get("rope_theta") != 1e4:
                diffs["rope_parameters"] = rp
            if not diffs:
                break
            notes.append("transformers' defaults differ from the engine's for %s: written explicitly" % diffs)
            tc = dict(tc, query_pre_attn_scalar=cfg.query_pre_attn_scalar, rms_norm_eps=cfg.rms_norm_eps,
                      layer_types=list(cfg.layer_types), rope_theta=rp["full_attention"]["rope_theta"],
                      rope_local_base_freq=rp["sliding_attention"]["rope_theta"])
        notes.append("config below is the text_config as transformers parses it (defaults filled in); config_file "
                     "holds config.json as written")
    parsed_text_config = json.loads(cfg.to_json_string(use_diff=False))
    cfg._attn_implementation = "eager"
    sp_ = H.write_tokenizer_files(folder, tok_path, 1024)
    assert sp_.get_piece_size() == cfg.vocab_size
    prompts = make_prompts(sp)

    # seed search on the bf16-rounded weights
    init = {"seed": seed, "embed_rms_c": 1.0, "final_norm_mean": -1.0, "final_norm_std": 5.0, "search": []}
    best = None
    for k in range(8):
        model = Gemma3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
        init_weights(model, seed + k, init)
        s = quick_score(model, prompts)
        s.update(seed=seed + k, ok=s["frac_margin_ok"] >= 0.85 and s["min_distinct"] >= 8)
        init["search"].append(s)
        log("%s seed %d: %s" % (name, seed + k, s))
        if best is None or (s["ok"], s["frac_margin_ok"]) > (best[0]["ok"], best[0]["frac_margin_ok"]):
            best = (s, model)
        if s["ok"]:
            break
    init["seed"] = best[0]["seed"]
    state = bf16_state(best[1])

    # write the weights, then compute everything from what was written
    if name == "t-mm":
        extra = save_mm_shards(folder, state)
        back = load_mm_back(folder)
        model = Gemma3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in back.items()}, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
        notes.append("references from Gemma3ForCausalLM(text_config) with the shards' language_model.model.* "
                     "tensors loaded back; ignored tensors: %s" % {k: str(v.dtype) for k, v in extra.items()})
        loaded = back
    else:
        save_single(folder, state)
        model = Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        loaded = {k: v for k, v in state.items()}
    sd = model.state_dict()
    weights_equal = all(torch.equal(sd[k], v.float()) for k, v in loaded.items())

    ref = {"model": name, "split": "tests/data",
           "config": parsed_text_config if name == "t-mm" else file_config,
           "init": init, "produced_with": H.produced_with("float32 on CPU, weights = bf16 safetensors upcast exactly"),
           "hf_view": H.hf_view(model), "format_notes": notes, "prompts": []}
    if name == "t-mm":
        ref["config_file"] = file_config
    checks = {"hf_weights_equal_bf16": weights_equal, "per_prompt": {}}
    full3 = None
    for i, (kind, ids) in enumerate(prompts.items()):
        entry, check, full = H.prompt_reference(model, kind, ids, want_all=i in (1, 3), want_steps=i == 3)
        ref["prompts"].append(entry)
        checks["per_prompt"][kind] = check
        if i == 3:
            full3 = full
    ids3 = prompts["text_100"]
    with torch.no_grad():
        sdpa = Gemma3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
        sdpa.load_state_dict(model.state_dict())
        checks["sdpa_vs_eager_max_abs"] = float((sdpa(input_ids=torch.tensor([ids3])).logits[0] - full3).abs().max())
        diag = {}
        for d in (-1, 1):
            c2 = copy.deepcopy(cfg)
            c2.sliding_window = cfg.sliding_window + d
            m2 = Gemma3ForCausalLM._from_config(c2, attn_implementation="eager", dtype=torch.float32).eval()
            m2.load_state_dict(model.state_dict())
            diag["window%+d_max_abs_vs_hf" % d] = float((m2(input_ids=torch.tensor([ids3])).logits[0] - full3)
                                                        .abs().max())
        checks["window_off_by_one_diag"] = diag
    allm = [m for p in ref["prompts"] for m in p["margins"]]
    checks["margins"] = {"min": min(allm), "frac_above_0.05": sum(m > 0.05 for m in allm) / len(allm)}
    checks["logit_range"] = [float(full3.min()), float(full3.max())]
    ref["checks"] = checks
    ref["tokenizer"] = H.tokenizer_section(sp)
    H.write_json(os.path.join(folder, "reference.json"), ref, compact=True)
    log("%s: written, %s" % (name, json.dumps({k: v for k, v in checks.items() if k != "per_prompt"})))
    return checks


def main():
    ap = argparse.ArgumentParser(description="tiny Gemma 3 test models with transformers references")
    ap.add_argument("--out", required=True, help="folder that receives t-gqa/, t-softcap/, t-mm/")
    ap.add_argument("--tokenizer", required=True, help="a Gemma-layout SentencePiece tokenizer.model (512 pieces)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--models", default="t-gqa,t-softcap,t-mm")
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    t0 = time.time()

    def log(msg):
        print("[%6.1fs] %s" % (time.time() - t0, msg), flush=True)

    summary = {}
    for i, name in enumerate(a.models.split(",")):
        summary[name] = build(name, a.out, sp, a.tokenizer, a.seed + 100 * i, log)
    log("done: %s" % json.dumps({n: {"margins": c["margins"], "sdpa_vs_eager_max_abs": c["sdpa_vs_eager_max_abs"]}
                                  for n, c in summary.items()}))


if __name__ == "__main__":
    main()
