"""`gemma3 serve` through the official openai client: chat and completions, streaming with usage, stop strings,
n, seeds, logprobs, errors; plus /tokenize, /detokenize, /v1/models, /metrics. Runs against a live server on a
fixture model, or on models/gemma3-pydoc where that is absent (see run.sh and test_server.py)."""
import json
import time

import openai

from harness import Skip

S = None          # the shared server (set by test_server.py)
MODEL = None      # its model id
MODEL_DIR = None  # the model's folder (config.json, reference.json)
SMALL_A = True    # whether that is the small-a fixture (False: the fallback demo model)
VOCAB = None      # its vocabulary size


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def register(r):
    @r.test
    def test_models_and_health():
        st, body = S.json("GET", "/health")
        assert st == 200 and body == {"status": "ok"}, (st, body)
        ids = [m.id for m in S.client().models.list().data]
        assert ids == [MODEL], ids
        st, one = S.json("GET", "/v1/models/" + MODEL)
        assert st == 200 and one["id"] == MODEL and one["max_model_len"] == S.ctx, (one, S.ctx)

    @r.test
    def test_chat_nonstreaming():
        c = S.client()
        r = chat(c, "Tell me about the sea.", max_tokens=20)
        ch = r.choices[0]
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
        assert ch.message.role == "assistant" and isinstance(ch.message.content, str)
        assert ch.finish_reason in ("stop", "length"), ch.finish_reason
        # usage.prompt_tokens is the size of the rendered chat prompt as /tokenize counts it
        st, tk = S.json("POST", "/tokenize", {"messages": [{"role": "user", "content": "Tell me about the sea."}]})
        assert st == 200, tk
        assert r.usage.prompt_tokens == tk["count"], (r.usage, tk["count"])
        assert 1 <= r.usage.completion_tokens <= 20
        if ch.finish_reason == "length":
            assert r.usage.completion_tokens == 20
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        return "%d prompt + %d completion tokens, finish %s" % (r.usage.prompt_tokens, r.usage.completion_tokens,
                                                                ch.finish_reason)

    @r.test
    def test_nul_bytes_survive_json():
        """small-a answers this prompt with a <0x00> byte piece first: the text must carry it (as \\u0000), not be
        cut at it, and be the same streamed or not. Another model is steered to that piece with logit_bias."""
        c = S.client()
        kw = {}
        if not SMALL_A:
            # a NUL inside a request string is refused (400), so find the <0x00> piece as the one before <0x01> (byte
            # pieces are in byte order) and check it with /detokenize
            st, tk = S.json("POST", "/tokenize", {"prompt": "\x01", "add_special_tokens": False})
            assert st == 200, tk
            nul = tk["tokens"][0] - 1 if len(tk["tokens"]) == 1 else -1
            st, dt = S.json("POST", "/detokenize", {"tokens": [nul]}) if nul >= 0 else (0, None)
            if st != 200 or dt["prompt"] != "\x00":
                raise Skip("%s has no <0x00> byte piece next to <0x01> (%s -> %s)" % (MODEL, tk["tokens"], dt))
            kw = {"logit_bias": {str(nul): 100}}
        full = chat(c, "Story 0: once there was a cat", max_tokens=32, **kw)
        text = ""
        for ch in chat(c, "Story 0: once there was a cat", max_tokens=32, stream=True, **kw):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
        content = full.choices[0].message.content
        assert content.startswith("\x00") and len(content) > 10, repr(content)
        assert text == content, (text, content)
        if not SMALL_A:  # steered to <0x00> at every step: one NUL per token, none cut or lost
            assert content == "\x00" * full.usage.completion_tokens == "\x00" * 32, (repr(content), full.usage)
            return "%s steered to the <0x00> piece (id %d) with logit_bias 100: 32 NULs carried" % (MODEL, nul)

    @r.test
    def test_chat_streaming_equals_nonstreaming_with_usage():
        c = S.client()
        full = chat(c, "Write a line about stars.", max_tokens=30)
        stream = chat(c, "Write a line about stars.", max_tokens=30, stream=True,
                      stream_options={"include_usage": True})
        text, finish, usage, ids, roles = "", None, None, set(), 0
        for chunk in stream:
            ids.add(chunk.id)
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                assert chunk.choices == [], "the usage chunk has no choices"
                usage = chunk.usage
                continue
            d = chunk.choices[0].delta
            if d.role:
                roles += 1
            text += d.content or ""
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert len(ids) == 1, ids
        assert roles == 1
        assert text == full.choices[0].message.content, (text, full.choices[0].message.content)
        assert finish == full.choices[0].finish_reason
        assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
        assert usage.prompt_tokens == full.usage.prompt_tokens

    @r.test
    def test_completions_text_and_ids_and_default_length():
        c = S.client()
        r = c.completions.create(model=MODEL, prompt="The quick brown fox", temperature=0)
        assert r.object == "text_completion" and r.id.startswith("cmpl-")
        assert r.usage.completion_tokens <= 16, "the default max_tokens of /v1/completions is 16"
        # the same prompt given as ids (BOS + tokens) gives the same greedy text
        st, tk = S.json("POST", "/tokenize", {"prompt": "The quick brown fox"})
        assert st == 200 and tk["tokens"][0] == 2, tk
        r2 = c.completions.create(model=MODEL, prompt=tk["tokens"], temperature=0)
        assert r2.choices[0].text == r.choices[0].text
        assert r2.usage.prompt_tokens == r.usage.prompt_tokens == tk["count"]
        # and streaming gives it too
        text = "".join(ch.choices[0].text for ch in
                       c.completions.create(model=MODEL, prompt="The quick brown fox", temperature=0, stream=True)
                       if ch.choices)
        assert text == r.choices[0].text

    @r.test
    def test_greedy_matches_reference_ids():
        """Greedy completion of a fixture prompt (as ids) equals the text of the HF reference continuation. The
        completion text leaves out control pieces such as <end_of_turn> where /detokenize writes them, so on another
        model than small-a (whose prompt 2 is the one checked) the first reference prompt, from prompt 2 on, whose
        continuation holds no special token is used."""
        ref = json.load(open(MODEL_DIR + "/reference.json"))
        idx = 2
        if not SMALL_A:
            with open(MODEL_DIR + "/tokenizer_config.json") as f:
                special = {int(k) for k, v in json.load(f).get("added_tokens_decoder", {}).items()
                           if v.get("special")}
            order = list(range(2, len(ref["prompts"]))) + [0, 1]
            plain = [i for i in order if not special & set(ref["prompts"][i]["generated_ids"])]
            if not plain:
                raise Skip("every reference continuation of %s holds a special token" % MODEL)
            idx = plain[0]
        p = ref["prompts"][idx]
        c = S.client()
        r = c.completions.create(model=MODEL, prompt=p["ids"], temperature=0, max_tokens=len(p["generated_ids"]),
                                 extra_body={"ignore_eos": True})
        st, dt = S.json("POST", "/detokenize", {"tokens": p["generated_ids"]})
        assert st == 200
        assert r.usage.completion_tokens == len(p["generated_ids"]), r.usage
        assert r.choices[0].text == dt["prompt"], (r.choices[0].text, dt["prompt"])
        assert r.choices[0].finish_reason == "length"
        return "reference prompt %d (%s): %d tokens" % (idx, p["kind"], len(p["generated_ids"]))

    @r.test
    def test_stop_strings_cut_the_text():
        c = S.client()
        base = c.completions.create(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=48,
                                    extra_body={"ignore_eos": True}).choices[0].text
        assert len(base) >= 12, base
        stop = base[len(base) // 2: len(base) // 2 + 3]
        want = base[: base.index(stop)]
        for stream in (False, True):
            if stream:
                text, fin = "", None
                for ch in c.completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                               max_tokens=48, stop=[stop], stream=True,
                                               extra_body={"ignore_eos": True}):
                    if ch.choices:
                        text += ch.choices[0].text
                        fin = ch.choices[0].finish_reason or fin
            else:
                rr = c.completions.create(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=48,
                                          stop=[stop, "never-appears-zzz"], extra_body={"ignore_eos": True})
                text, fin = rr.choices[0].text, rr.choices[0].finish_reason
                assert rr.usage.completion_tokens < 48
            assert text == want, (stream, stop, text, want)
            assert fin == "stop", fin
        return "stop %r after %d chars" % (stop, len(want))

    @r.test
    def test_n_choices_and_seed():
        c = S.client()
        a = chat(c, "Pick a word.", temperature=1.0, n=3, seed=1234, max_tokens=12)
        b = chat(c, "Pick a word.", temperature=1.0, n=3, seed=1234, max_tokens=12)
        assert [x.index for x in a.choices] == [0, 1, 2]
        assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices], "same seed"
        assert len({x.message.content for x in a.choices}) > 1, "choices use different seeds"
        d = chat(c, "Pick a word.", temperature=1.0, n=3, seed=99, max_tokens=12)
        assert [x.message.content for x in d.choices] != [x.message.content for x in a.choices]
        # streaming with n: every index gets its own role chunk and finish
        fins = {}
        for ch in chat(c, "Pick a word.", temperature=1.0, n=2, seed=5, max_tokens=8, stream=True):
            for x in ch.choices:
                if x.finish_reason:
                    fins[x.index] = x.finish_reason
        assert set(fins) == {0, 1}, fins

    @r.test
    def test_logprobs():
        c = S.client()
        r = chat(c, "Count to three.", logprobs=True, top_logprobs=3, max_tokens=10)
        lp = r.choices[0].logprobs.content
        assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage)
        for e in lp:
            assert len(e.top_logprobs) == 3
            tops = [t.logprob for t in e.top_logprobs]
            assert tops == sorted(tops, reverse=True), tops
            assert abs(e.logprob - tops[0]) < 1e-5, "greedy picks the most likely token"
            assert e.logprob <= 0 and bytes(e.bytes).decode("utf-8", "replace") is not None
        cr = c.completions.create(model=MODEL, prompt="abc", temperature=0, max_tokens=5, logprobs=2)
        l2 = cr.choices[0].logprobs
        assert len(l2.tokens) == len(l2.token_logprobs) == len(l2.top_logprobs) == len(l2.text_offset) == 5
        assert l2.text_offset == sorted(l2.text_offset)

    @r.test
    def test_client_errors_map_to_exceptions():
        c = S.client()
        bad = S.client()
        bad.api_key = "wrong"
        for fn, exc, needle in [
            (lambda: chat(bad, "hi"), openai.AuthenticationError, "API key"),
            (lambda: c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}]),
             openai.NotFoundError, "does not exist"),
            (lambda: chat(c, "hi", temperature=5), openai.BadRequestError, "temperature"),
            (lambda: chat(c, "hi", max_tokens=S.ctx + 88), openai.BadRequestError,
             "maximum context length is %d" % S.ctx),
            (lambda: c.chat.completions.create(model=MODEL, messages=[]), openai.BadRequestError, "at least one"),
        ]:
            try:
                fn()
            except exc as e:
                assert needle in str(e), (needle, str(e))
                assert e.body and "message" in e.body, e.body
            else:
                raise AssertionError("expected %s (%s)" % (exc.__name__, needle))

    @r.test
    def test_prefix_reuse_is_reported():
        c = S.client()
        system = "You are a careful assistant. " * 30  # a long shared system prompt
        m0 = S.metrics()["gemma3_prompt_tokens_cached_total"]
        first = c.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "First question?"}])
        second = c.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "Another one?"}])
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert first.usage.prompt_tokens > 150, first.usage
        assert cached >= 100, "the shared system prompt is reused (%s)" % second.usage
        assert cached < second.usage.prompt_tokens
        m1 = S.metrics()["gemma3_prompt_tokens_cached_total"]
        assert m1 - m0 == first.usage.prompt_tokens_details.cached_tokens + cached, (m0, m1)
        return "%d of %d prompt tokens from the prefix cache" % (cached, second.usage.prompt_tokens)

    @r.test
    def test_tokenize_detokenize_round_trip():
        text = "Hello world, this is a test."
        st, tk = S.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        assert st == 200 and tk["count"] == len(tk["tokens"]) and tk["max_model_len"] == S.ctx, tk
        assert tk["tokens"][0] != 2
        st, dt = S.json("POST", "/detokenize", {"tokens": tk["tokens"]})
        assert st == 200 and dt["prompt"] == text, dt
        st, tk2 = S.json("POST", "/tokenize", {"prompt": text})
        assert tk2["tokens"] == [2] + tk["tokens"]

    @r.test
    def test_metrics_exposition():
        chat(S.client(), "A request so that the counters move.", max_tokens=4)
        m = S.metrics()
        # the response can reach the client just before the engine thread releases the sequence's blocks (seen on a
        # loaded 2-core CI machine): idle means no blocks in use within a few seconds, not at the same instant
        for _ in range(50):
            if m["gemma3_kv_blocks_used"] == 0:
                break
            time.sleep(0.1)
            m = S.metrics()
        for k in ["gemma3_requests_total", "gemma3_generation_tokens_total", "gemma3_prompt_tokens_total",
                  "gemma3_queue_length", "gemma3_requests_running", "gemma3_kv_blocks_used", "gemma3_kv_blocks_free", "gemma3_kv_blocks_cached",
                  "gemma3_time_to_first_token_seconds_count", "gemma3_inter_token_latency_seconds_count",
                  'gemma3_time_to_first_token_seconds_bucket{le="+Inf"}', "gemma3_prompt_tokens_cached_total",
                  "gemma3_decode_steps_overlapped_total"]:
            assert k in m, k
        assert m["gemma3_requests_total"] > 0 and m["gemma3_generation_tokens_total"] > 0
        assert m["gemma3_time_to_first_token_seconds_count"] > 0
        assert m["gemma3_inter_token_latency_seconds_count"] > 0
        assert m["gemma3_kv_blocks_used"] == 0, \
            "idle: only the prefix cache may hold blocks (used %d, cached %d)" % (m["gemma3_kv_blocks_used"],
                                                                               m["gemma3_kv_blocks_cached"])
        assert (m["gemma3_kv_blocks_free"] + m["gemma3_kv_blocks_used"] + m["gemma3_kv_blocks_cached"]
                == m["gemma3_kv_blocks_total"])
        assert m['gemma3_time_to_first_token_seconds_bucket{le="+Inf"}'] == \
            m["gemma3_time_to_first_token_seconds_count"]
        return "%d requests, %d tokens generated" % (m["gemma3_requests_total"],
                                                     m["gemma3_generation_tokens_total"])
