#!/usr/bin/env python3
"""Load generator for `gemma3 serve` (or any OpenAI-compatible server with the same extensions).

C concurrent clients send N streaming /v1/completions requests in total, each with a prompt of exactly P tokens
(random token ids, or a shared prefix plus random ids) and exactly O output tokens (ignore_eos), and report
requests/s, output tokens/s, and p50/p90/p99 of time-to-first-token (TTFT) and inter-token latency (ITL).
Each streamed chunk carries the tokens it holds (logprobs=0 asks for the token list), so a chunk of k tokens
counts as k arrivals and ITL is measured per token. Standard library only, so it runs on any machine.

  python3 bench/loadgen.py --url http://127.0.0.1:8006 --concurrency 16 --requests 64 --prompt-tokens 128 \\
      --output-tokens 64 [--api-key KEY] [--shared-prefix 0] [--json out.json]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Target:
    def __init__(self, url, api_key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    def post(self, path, obj):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("POST", path, body=json.dumps(obj), headers=self.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, json.loads(body)


def server_counters(t):
    """gemma3 serve's cumulative counters from /metrics ({} for servers without them)."""
    try:
        st, body = t.get("/metrics")
    except OSError:
        return {}
    out = {}
    if st == 200:
        for line in body.decode("utf-8", "replace").splitlines():
            for k in ("gemma3_prompt_tokens_cached_total", "gemma3_prompt_tokens_total", "gemma3_preemptions_total"):
                if line.startswith(k + " "):
                    out[k] = float(line.split()[1])
    return out


def one_request(t, model, ids, out_tokens, timeout):
    """Streams one completion; returns dict(ok, ttft, itls, n_out, e2e, err)."""
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": out_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                       "logprobs": 0})
    c = http.client.HTTPConnection(t.host, t.port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/completions", body=body, headers=t.headers)
        r = c.getresponse()
        if r.status != 200:
            return {"ok": False, "err": "HTTP %d %s" % (r.status, r.read()[:200])}
        arrivals, usage, buf = [], None, b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            ev = json.loads(data)
            if "error" in ev:
                return {"ok": False, "err": ev["error"].get("message")}
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                lp = ch.get("logprobs") or {}
                k = len(lp.get("tokens") or [])
                if k == 0 and ch.get("text"):
                    k = 1
                arrivals += [now] * k
        e2e = time.perf_counter() - t0
        if not arrivals:
            return {"ok": False, "err": "no tokens"}
        itls = [b - a for a, b in zip(arrivals, arrivals[1:])]
        n_out = usage["completion_tokens"] if usage else len(arrivals)
        return {"ok": True, "ttft": arrivals[0] - t0, "itls": itls, "n_out": n_out, "e2e": e2e,
                "n_prompt": usage["prompt_tokens"] if usage else len(ids)}
    except (OSError, http.client.HTTPException, ValueError) as e:
        return {"ok": False, "err": repr(e)}
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8006")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    ap.add_argument("--concurrency", "-c", type=int, default=8)
    ap.add_argument("--requests", "-n", type=int, default=64)
    ap.add_argument("--prompt-tokens", "-p", type=int, default=128)
    ap.add_argument("--output-tokens", "-o", type=int, default=64)
    ap.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt shares at its start")
    ap.add_argument("--token-range", default="200:900", help="random prompt ids are drawn from LO:HI")
    ap.add_argument("--seed", type=int, default=None,
                    help="prompt generator seed (default: a fresh one, so runs do not hit each other's prefix cache)")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent (and not counted) before the run")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()

    t = Target(a.url, a.api_key)
    st, body = t.get("/v1/models")
    if st != 200:
        sys.exit("GET /v1/models: HTTP %d %s" % (st, body[:200]))
    info = json.loads(body)["data"][0]
    model = a.model or info["id"]
    st, tk = t.post("/tokenize", {"prompt": ""})
    bos = tk["tokens"][:1] if st == 200 else [2]
    lo, hi = (int(x) for x in a.token_range.split(":"))
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    rng = random.Random(a.seed)
    prefix = [rng.randrange(lo, hi) for _ in range(a.shared_prefix)]
    n_rand = max(0, a.prompt_tokens - len(bos) - len(prefix))
    prompts = [bos + prefix + [rng.randrange(lo, hi) for _ in range(n_rand)] for _ in range(a.requests + a.warmup)]

    for i in range(a.warmup):
        one_request(t, model, prompts[a.requests + i], min(a.output_tokens, 8), a.timeout)

    results, lock, next_i = [], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = next_i[0]
                if i >= a.requests:
                    return
                next_i[0] += 1
            r = one_request(t, model, prompts[i], a.output_tokens, a.timeout)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
    c0 = server_counters(t)
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    c1 = server_counters(t)
    delta = {k: c1[k] - c0.get(k, 0) for k in c1}

    ok = [r for r in results if r["ok"]]
    bad = [r for r in results if not r["ok"]]
    out_tok = sum(r["n_out"] for r in ok)
    in_tok = sum(r["n_prompt"] for r in ok)
    ttft = [r["ttft"] * 1e3 for r in ok]
    itl = [x * 1e3 for r in ok for x in r["itls"]]
    e2e = [r["e2e"] * 1e3 for r in ok]
    res = {
        "model": model, "url": a.url, "concurrency": a.concurrency, "requests": a.requests,
        "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens, "shared_prefix": a.shared_prefix,
        "seed": a.seed,
        "completed": len(ok), "failed": len(bad), "wall_s": wall,
        "requests_per_s": len(ok) / wall, "output_tok_per_s": out_tok / wall,
        "total_tok_per_s": (out_tok + in_tok) / wall,
        "ttft_ms": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99), "mean": sum(ttft) / max(1, len(ttft))},
        "itl_ms": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99), "mean": sum(itl) / max(1, len(itl))},
        "e2e_ms": {"p50": pct(e2e, 50), "p90": pct(e2e, 90), "p99": pct(e2e, 99)},
        "server_counters_delta": delta,
    }
    print("model %s  concurrency %d  requests %d  prompt %d tok  output %d tok  shared prefix %d  seed %d" % (
        model, a.concurrency, a.requests, a.prompt_tokens, a.output_tokens, a.shared_prefix, a.seed))
    print("completed %d  failed %d  wall %.2f s" % (len(ok), len(bad), wall))
    print("requests/s %.2f  output tok/s %.1f  total tok/s %.1f" % (
        res["requests_per_s"], res["output_tok_per_s"], res["total_tok_per_s"]))
    for k in ("ttft_ms", "itl_ms", "e2e_ms"):
        v = res[k]
        print("%-7s p50 %8.1f  p90 %8.1f  p99 %8.1f  (ms)" % (k[:-3].upper(), v["p50"], v["p90"], v["p99"]))
    if delta:
        print("server: %d prompt tokens, %d from the prefix cache, %d preemptions" % (
            delta.get("gemma3_prompt_tokens_total", 0), delta.get("gemma3_prompt_tokens_cached_total", 0),
            delta.get("gemma3_preemptions_total", 0)))
    for r in bad[:5]:
        print("error:", r["err"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
