#!/usr/bin/env python3
"""Trains the demo model models/gemma3-pydoc: transformers' Gemma3ForCausalLM (exact Gemma 3 architecture:
sliding-window and global layers, GQA, QK-norm, two rope bases, tied embeddings) on the Python 3.11 documentation
prepared by tools/build_demo_corpus.sh, then a short chat fine-tune in Gemma's turn format (questions made from
section titles and API entries, answered by their opening paragraph). Writes the Hugging Face folder (config.json,
bf16 model.safetensors, tokenizer files with the chat template), reference.json (transformers float32 outputs for
the engine's parity test), samples.json, train_log.json, loss.png and results.json.

  python3 tools/train_demo_model.py --data build-demo --out models/gemma3-pydoc [--pretrain-seconds 200]

Runs on one CUDA GPU (bf16 autocast); a few minutes on an H200.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as H  # noqa: E402

# Released-checkpoint style (gemma-3-1b-it's config.json layout), scaled down to ~14M parameters.
CONFIG = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
          "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
          "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 64,
          "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 320, "initializer_range": 0.02,
          "intermediate_size": 1280, "max_position_embeddings": 1024, "model_type": "gemma3_text",
          "num_attention_heads": 4, "num_hidden_layers": 8, "num_key_value_heads": 2, "pad_token_id": 0,
          "query_pre_attn_scalar": 64, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
          "rope_theta": 1000000.0, "sliding_window": 128, "sliding_window_pattern": 4, "torch_dtype": "bfloat16",
          "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 8192}

QUESTIONS = ["What is a list comprehension?", "What does the json module do?", "What does len() do?",
             "Tell me about the for statement.", "What is a generator?", "What does os.path.join() do?",
             "What is the difference between a tuple and a list?", "How do I read a file line by line?"]
CHAT_REF = [{"role": "user", "content": "What does the json module do?"}]
TEXT_40 = ("A list comprehension consists of brackets containing an expression followed by a for clause, then zero "
           "or more for or if clauses. The result will be a new list resulting from evaluating the expression in the "
           "context of the for and if clauses which follow it.")
TEXT_PROMPTS = ["The for statement", "A dictionary is", "import collections\n\n"]


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def log(msg, t0=[time.time()]):
    print("[%7.1fs] %s" % (time.time() - t0[0], msg), flush=True)


def load_data(d, dev):
    tr = torch.from_numpy(np.fromfile(os.path.join(d, "train.bin"), dtype=np.uint16).astype(np.int64)).to(dev)
    va = torch.from_numpy(np.fromfile(os.path.join(d, "val.bin"), dtype=np.uint16).astype(np.int64)).to(dev)
    info = json.load(open(os.path.join(d, "data.json")))
    L = info["sft_len"]
    sft = {}
    for split in ("train", "val"):
        ids = np.fromfile(os.path.join(d, "sft_%s.bin" % split), dtype=np.uint16).astype(np.int64).reshape(-1, L)
        m = np.fromfile(os.path.join(d, "sft_%s_mask.bin" % split), dtype=np.uint8).reshape(-1, L)
        sft[split] = (torch.from_numpy(ids).to(dev), torch.from_numpy(m.astype(np.bool_)).to(dev))
    return tr, va, sft, info


def text_batch(stream, B, T, gen):
    """B windows of T tokens at random offsets, each starting with <bos>."""
    starts = torch.randint(0, stream.numel() - T, (B,), device=stream.device, generator=gen)
    x = stream[starts[:, None] + torch.arange(T, device=stream.device)]
    x[:, 0] = 2
    return x


def lm_loss(model, x, mask=None):
    """Mean next-token cross-entropy; mask (same shape as x) selects the target positions."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        logits = model(input_ids=x, use_cache=False).logits
    logits = logits[:, :-1].float()
    tgt = x[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
    if mask is None:
        return ce.mean(), ce.numel()
    m = mask[:, 1:].float()
    return (ce * m).sum() / m.sum().clamp(min=1), int(m.sum())


@torch.no_grad()
def eval_text(model, stream, T=512, B=64):
    """Loss over the whole validation stream in windows of T tokens (<bos> + T-1 tokens each)."""
    model.eval()
    n = (stream.numel() - 1) // (T - 1)
    tot, cnt = 0.0, 0
    for b in range(0, n, B):
        k = min(B, n - b)
        idx = (torch.arange(b, b + k, device=stream.device)[:, None] * (T - 1)) + torch.arange(T - 1,
                                                                                                 device=stream.device)
        x = torch.cat([torch.full((k, 1), 2, device=stream.device, dtype=torch.long), stream[idx]], dim=1)
        loss, c = lm_loss(model, x)
        tot += float(loss) * c
        cnt += c
    model.train()
    return tot / cnt


@torch.no_grad()
def eval_chat(model, data, B=128):
    model.eval()
    ids, mask = data
    tot, cnt = 0.0, 0
    for b in range(0, ids.shape[0], B):
        loss, c = lm_loss(model, ids[b:b + B], mask[b:b + B])
        tot += float(loss) * c
        cnt += c
    model.train()
    return tot / cnt


def lr_at(p, peak, warm_frac, floor):
    if p < warm_frac:
        return peak * p / warm_frac
    q = min(1.0, (p - warm_frac) / (1 - warm_frac))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * q)))


def make_opt(model, lr, wd):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}], lr=lr,
                             betas=(0.9, 0.95), eps=1e-8, fused=next(model.parameters()).is_cuda)


def pretrain(model, tr, va, sft_val, a, gen, hist):
    T, B = a.seq, a.batch
    steps = int(a.epochs * tr.numel() / (B * T))
    opt = make_opt(model, a.lr, a.wd)
    best = (float("inf"), None, -1)
    t0 = time.time()
    step = 0
    while True:
        p = max(step / steps, (time.time() - t0) / a.pretrain_seconds)
        if p >= 1:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(p, a.lr, 0.03, 0.1)
        loss, _ = lm_loss(model, text_batch(tr, B, T, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            hist["train"].append([step, time.time() - t0, loss.item()])
        if step % a.eval_every == 0:
            v = eval_text(model, va)
            hist["val"].append([step, time.time() - t0, v])
            log("pretrain step %d (%.2f epochs) loss %.3f val %.3f (ppl %.2f) lr %.2e" % (
                step, step * B * T / tr.numel(), float(loss), v, math.exp(v), opt.param_groups[0]["lr"]))
            if v < best[0]:
                best = (v, {k: t.detach().clone() for k, t in model.state_dict().items()}, step)
    v = eval_text(model, va)
    hist["val"].append([step, time.time() - t0, v])
    if v < best[0]:
        best = (v, {k: t.detach().clone() for k, t in model.state_dict().items()}, step)
    secs = time.time() - t0
    model.load_state_dict(best[1])
    log("pretrain: %d steps in %.1f s, %.2f epochs; best val loss %.4f (ppl %.2f) at step %d" % (
        step, secs, step * B * T / tr.numel(), best[0], math.exp(best[0]), best[2]))
    return {"steps": step, "seconds": secs, "epochs": step * B * T / tr.numel(), "best_step": best[2],
            "best_val_loss": best[0], "tokens_per_step": B * T, "planned_steps": steps}


def finetune(model, tr, va, sft, a, gen, hist, offset):
    ids, mask = sft["train"]
    opt = make_opt(model, a.sft_lr, a.wd)
    steps = int(a.sft_epochs * ids.shape[0] / a.sft_batch)
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step / steps, a.sft_lr, 0.05, 0.0)
        sel = torch.randint(0, ids.shape[0], (a.sft_batch,), device=ids.device, generator=gen)
        lc, _ = lm_loss(model, ids[sel], mask[sel])
        lt, _ = lm_loss(model, text_batch(tr, a.sft_text_batch, a.seq, gen))
        loss = lc + a.sft_text_weight * lt
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 10 == 0:
            hist["sft"].append([offset + step + 1, time.time() - t0, lc.item(), lt.item()])
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log("sft step %d/%d chat loss %.3f text loss %.3f" % (step + 1, steps, float(lc), float(lt)))
    return {"steps": steps, "seconds": time.time() - t0, "examples": int(ids.shape[0]), "batch": a.sft_batch}


def save_folder(model, out, tok):
    import shutil

    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    lic = os.path.join(os.path.dirname(tok), "CORPUS-LICENSE.txt")  # written by tools/build_demo_corpus.sh
    if os.path.exists(lic):
        shutil.copyfile(lic, os.path.join(out, "CORPUS-LICENSE.txt"))
    H.write_json(os.path.join(out, "config.json"), CONFIG)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return H.write_tokenizer_files(out, tok, CONFIG["max_position_embeddings"])


@torch.no_grad()
def chat_answer(model, sp, q, sample=False, max_new=160):
    ids, _ = H.chat_ids(sp, [{"role": "user", "content": q}])
    x = torch.tensor([ids], device=model.device)
    kw = dict(do_sample=True, temperature=0.7, top_k=64, top_p=0.95) if sample else dict(do_sample=False)
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                         eos_token_id=[1, 106], pad_token_id=0, **kw)
    gen = out[0, len(ids):].tolist()
    return sp.decode([t for t in gen if t not in (1, 106)]), len(gen)


def plot(hist, path, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # matplotlib is optional
        log("no plot: %s" % e)
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    tr = np.array(hist["train"], dtype=float).reshape(-1, 3)
    va = np.array(hist["val"], dtype=float).reshape(-1, 3)
    ax.plot(tr[:, 0], tr[:, 2], lw=0.8, label="pretraining loss (train batches)")
    ax.plot(va[:, 0], va[:, 2], "o-", ms=3, label="validation loss (held-out documents)")
    if hist["sft"]:
        s = np.array(hist["sft"], dtype=float).reshape(-1, 4)
        ax.plot(s[:, 0], s[:, 2], lw=0.8, label="chat fine-tune: answer loss")
        ax.plot(s[:, 0], s[:, 3], lw=0.8, label="chat fine-tune: text loss")
        ax.axvline(results["pretrain"]["steps"], color="grey", ls=":", lw=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(top=min(8.0, float(max(tr[:, 2].max(initial=0), va[:, 2].max(initial=0)))))
    ax.set_title("gemma3-pydoc: %.1fM parameters, val perplexity %.1f" % (results["params"] / 1e6,
                                                                          results["val_ppl_final_bf16"]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return True


def reference(folder, sp, val_stream):
    """transformers float32 eager on the CPU from the written bf16 folder, as for the test fixtures."""
    from transformers import Gemma3ForCausalLM
    model = Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    prompts = {"text_short": [2] + sp.encode("The for statement"),
               "chat": H.chat_ids(sp, CHAT_REF)[0],
               "text_40": ([2] + sp.encode(TEXT_40))[:40],
               "text_100": [2] + val_stream[1:100].tolist()}
    ref = {"model": "gemma3-pydoc", "split": "models", "config": CONFIG,
           "produced_with": H.produced_with("float32 on CPU, weights = bf16 safetensors upcast exactly"),
           "hf_view": H.hf_view(model), "prompts": [], "checks": {"per_prompt": {}},
           "format_notes": ["last_prompt_logits only (no all_prompt_logits / generated_step_logits) to keep the "
                            "model folder small"]}
    texts = {"text_short": "The for statement", "chat": H.chat_ids(sp, CHAT_REF)[1]}
    for kind, ids in prompts.items():
        entry, check, _ = H.prompt_reference(model, kind, ids)
        if kind in texts:
            entry["text"] = texts[kind]  # ids == [2] + encode(text) with special pieces parsed
        entry["generated_text"] = sp.decode(entry["generated_ids"])
        ref["prompts"].append(entry)
        ref["checks"]["per_prompt"][kind] = check
    allm = [m for p in ref["prompts"] for m in p["margins"]]
    ref["checks"]["margins"] = {"min": min(allm), "frac_above_0.01": sum(m > 0.01 for m in allm) / len(allm)}
    H.write_json(os.path.join(folder, "reference.json"), ref, compact=True)
    return model, ref


def main():
    ap = argparse.ArgumentParser(description="train the gemma3-pydoc demo model")
    ap.add_argument("--data", default="build-demo")
    ap.add_argument("--out", default="models/gemma3-pydoc")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--epochs", type=float, default=16)
    ap.add_argument("--pretrain-seconds", type=float, default=200)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--sft-epochs", type=float, default=2)
    ap.add_argument("--sft-batch", type=int, default=64)
    ap.add_argument("--sft-lr", type=float, default=3e-4)
    ap.add_argument("--sft-text-batch", type=int, default=16)
    ap.add_argument("--sft-text-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-dropout", type=float, default=0.1, help="training only; the shipped config says 0")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a quick smoke test of this script")
    ap.add_argument("--hidden", type=int, default=0, help="override hidden_size (smoke tests)")
    a = ap.parse_args()
    from transformers import AutoConfig, Gemma3ForCausalLM
    import transformers
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(a.device)
    if a.hidden:
        CONFIG.update(hidden_size=a.hidden, intermediate_size=4 * a.hidden, num_hidden_layers=4)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    tr, va, sft, info = load_data(a.data, dev)
    log("data: %d train tokens, %d val tokens, %d/%d chat examples; %s" % (
        tr.numel(), va.numel(), sft["train"][0].shape[0], sft["val"][0].shape[0], device_name(dev)))
    os.makedirs(a.out, exist_ok=True)
    H.write_json(os.path.join(a.out, "config.json"), CONFIG)
    cfg = AutoConfig.from_pretrained(a.out)
    cfg.attention_dropout = a.attn_dropout
    model = Gemma3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).to(dev).train()
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %d parameters (embeddings %d), layer types %s" % (
        n_params, model.model.embed_tokens.weight.numel(), cfg.layer_types))
    hist = {"train": [], "val": [], "sft": []}
    results = {"params": n_params, "config": CONFIG, "data": info, "args": vars(a),
               "software": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "gpu": device_name(dev)}}
    results["chat_val_loss_before_sft"] = eval_chat(model, sft["val"])
    t_all = time.time()
    results["pretrain"] = pretrain(model, tr, va, sft["val"], a, gen, hist)
    results["chat_val_loss_after_pretrain"] = eval_chat(model, sft["val"])
    results["sft"] = finetune(model, tr, va, sft, a, gen, hist, results["pretrain"]["steps"])
    results["train_seconds"] = time.time() - t_all
    results["val_loss_final"] = eval_text(model, va)
    results["chat_val_loss_final"] = eval_chat(model, sft["val"])
    log("final: val loss %.4f (ppl %.2f), chat val loss %.4f" % (
        results["val_loss_final"], math.exp(results["val_loss_final"]), results["chat_val_loss_final"]))

    sp = save_folder(model, a.out, os.path.join(a.data, "tokenizer.model"))
    # the shipped bf16 weights, evaluated again on the GPU (float32 compute)
    m16 = Gemma3ForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    results["val_loss_final_bf16"] = eval_text(m16, va)
    results["val_ppl_final_bf16"] = math.exp(results["val_loss_final_bf16"])
    results["val_bits_per_char_bf16"] = results["val_loss_final_bf16"] * va.numel() / info["val_chars"] / math.log(2)
    results["val_ppl_best_pretrain"] = math.exp(results["pretrain"]["best_val_loss"])
    del m16
    log("bf16 folder: val ppl %.2f, %.3f bits/char" % (results["val_ppl_final_bf16"],
                                                        results["val_bits_per_char_bf16"]))
    t_ref = time.time()
    torch.set_num_threads(8)
    cpu_model, ref = reference(a.out, sp, va.cpu())
    results["reference_checks"] = ref["checks"]
    log("reference.json written in %.1f s; greedy: %s" % (time.time() - t_ref, [p["generated_text"][:60] for p
                                                                                in ref["prompts"]]))
    samples = {"greedy_chat": [], "sampled_chat": [], "greedy_text": []}
    gpu_model = Gemma3ForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager").to(dev)
    for q in QUESTIONS:
        ans, n = chat_answer(gpu_model, sp, q)
        samples["greedy_chat"].append({"q": q, "a": ans, "tokens": n})
        log("Q: %s\nA: %s" % (q, ans))
    torch.manual_seed(1)
    for q in QUESTIONS[:4]:
        ans, n = chat_answer(gpu_model, sp, q, sample=True)
        samples["sampled_chat"].append({"q": q, "a": ans, "tokens": n, "sampling": "T 0.7, top-k 64, top-p 0.95"})
    for t in TEXT_PROMPTS:
        x = torch.tensor([[2] + sp.encode(t)], device=dev)
        out = gpu_model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=80, do_sample=False,
                                 eos_token_id=[1, 106], pad_token_id=0)
        samples["greedy_text"].append({"prompt": t, "continuation": sp.decode(out[0, x.shape[1]:].tolist())})
    H.write_json(os.path.join(a.out, "samples.json"), samples)
    H.write_json(os.path.join(a.out, "train_log.json"), hist, compact=True)
    results["plot"] = plot(hist, os.path.join(a.out, "loss.png"), results)
    H.write_json(os.path.join(a.out, "results.json"), results)
    log("done: %s" % json.dumps({k: results[k] for k in ("params", "train_seconds", "val_ppl_final_bf16",
                                                          "val_ppl_best_pretrain", "chat_val_loss_final")}))


if __name__ == "__main__":
    main()
