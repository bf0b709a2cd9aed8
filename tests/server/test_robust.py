"""`gemma3 serve` under abuse: the bad-input table, raw SSE framing through curl, 64 concurrent streams against
sequential runs, client disconnects (KV blocks back to free per /metrics), queue overflow (429), and graceful
SIGTERM / SIGINT shutdown (exit 0)."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

from harness import Server, wait_for

S = None          # the shared server (set by test_server.py)
MODEL = None
MODEL_DIR = None  # the model's folder: the small-a fixture, or models/gemma3-pydoc where that is absent
SMALL_A = True
VOCAB = None      # its vocabulary size
SLOW = {}     # lazily started slow server (every step sleeps), for disconnect and queue tests


def slow_server():
    if "s" not in SLOW:
        # no prefix cache here, so that "blocks freed" means kv_blocks_used back to exactly 0
        SLOW["s"] = Server(MODEL_DIR, "--test-step-delay-ms", "25", "--max-queue", "1", "--quiet",
                           "--no-prefix-cache", max_seqs=2)
    return SLOW["s"]


def stop_slow():
    if "s" in SLOW:
        SLOW.pop("s").stop()


def seq_blocks(m):
    """KV blocks held by sequences (the prefix cache's reclaimable blocks are counted apart, as cached)."""
    return m["gemma3_kv_blocks_used"]


def curl(*args, data=None):
    p = subprocess.run(["curl", "-sS", *args], input=data, capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def open_stream(srv, body, path="/v1/chat/completions"):
    """Raw socket with a streaming request sent; returns the socket."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (path, srv.api_key, len(data))).encode() + data)
    return s


def read_events(s, n, buf=b""):
    """Reads from s until n 'data:' events arrived; returns the bytes read."""
    while buf.count(b"data: ") < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def long_chat(max_tokens=400, stream=True):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Talk for a long time."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True}


def register(r):
    @r.test
    def test_bad_input_table():
        chat_url = "/v1/chat/completions"
        ok_msg = [{"role": "user", "content": "hi"}]
        long_text = "word " * (700 * S.ctx // 512)  # well over the context
        st, tk = S.json("POST", "/tokenize", {"messages": [{"role": "user", "content": long_text}]})
        n_long = tk["count"]
        assert n_long > S.ctx, (n_long, S.ctx)
        st, tk = S.json("POST", "/tokenize", {"messages": ok_msg})
        n_ok = tk["count"]
        over = max(500, S.ctx - n_ok + 1)  # max_tokens that, with the prompt, just passes the context
        oov = max(5000, VOCAB)  # a token id outside the vocabulary
        cases = [
            # (name, method, path, body, kwargs, status, substring of error.message, param)
            ("malformed json", "POST", chat_url, '{"messages": [', {}, 400, "not valid JSON", None),
            ("trailing garbage", "POST", chat_url, '{"messages": []} x', {}, 400, "not valid JSON", None),
            ("not an object", "POST", chat_url, "[1, 2]", {}, 400, "JSON object", None),
            ("deep nesting", "POST", chat_url, "[" * 5000, {}, 400, "not valid JSON", None),
            ("messages wrong type", "POST", chat_url, {"messages": "hi"}, {}, 400, "must be an array", "messages"),
            ("empty messages", "POST", chat_url, {"messages": []}, {}, 400, "at least one", "messages"),
            ("missing messages", "POST", chat_url, {"model": MODEL}, {}, 400, "required", "messages"),
            ("bad role", "POST", chat_url, {"messages": [{"role": "wizard", "content": "x"}]}, {}, 400, "wizard",
             "messages[0].role"),
            ("content wrong type", "POST", chat_url, {"messages": [{"role": "user", "content": 42}]}, {}, 400,
             "string or an array", "messages[0].content"),
            ("image part", "POST", chat_url,
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, {},
             400, "image_url", "messages[0].content"),
            ("max_tokens string", "POST", chat_url, {"messages": ok_msg, "max_tokens": "10"}, {}, 400, "integer",
             "max_tokens"),
            ("max_tokens huge", "POST", chat_url, {"messages": ok_msg, "max_tokens": 1e30}, {}, 400, "between",
             "max_tokens"),
            ("temperature bool", "POST", chat_url, {"messages": ok_msg, "temperature": True}, {}, 400, "number",
             "temperature"),
            ("n zero", "POST", chat_url, {"messages": ok_msg, "n": 0}, {}, 400, "between 1", "n"),
            ("unknown field", "POST", chat_url, {"messages": ok_msg, "frobnicate": 1}, {}, 400, "Unrecognized",
             "frobnicate"),
            ("tools", "POST", chat_url, {"messages": ok_msg, "tools": [{"type": "function"}]}, {}, 400,
             "not supported", "tools"),
            ("prompt too long", "POST", chat_url, {"messages": [{"role": "user", "content": long_text}]}, {}, 400,
             "maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, "
             "0 in the completion)" % (S.ctx, n_long, n_long), "messages"),
            ("prompt + max_tokens too long", "POST", chat_url, {"messages": ok_msg, "max_tokens": over}, {}, 400,
             "you requested %d tokens (%d in the messages, %d in the completion)" % (n_ok + over, n_ok, over),
             "messages"),
            ("completion token out of vocab", "POST", "/v1/completions", {"prompt": [2, oov]}, {}, 400,
             "out of range", "prompt"),
            ("wrong model", "POST", chat_url, {"model": "gpt-4", "messages": ok_msg}, {}, 404, "does not exist",
             "model"),
            ("wrong api key", "POST", chat_url, {"messages": ok_msg},
             {"auth": False, "headers": {"Authorization": "Bearer nope"}}, 401, "API key", None),
            ("missing api key", "GET", "/v1/models", None, {"auth": False}, 401, "API key", None),
            ("unknown route", "GET", "/v1/engines", None, {}, 404, "Invalid URL", None),
            ("unknown route post", "POST", "/v2/chat", {"messages": ok_msg}, {}, 404, "Invalid URL", None),
            ("wrong method", "GET", chat_url, None, {}, 405, "not allowed", None),
        ]
        for name, method, path, body, kw, status, needle, param in cases:
            st, hdr, data = S.request(method, path, body, **kw)
            try:
                err = json.loads(data)["error"]
            except Exception:
                raise AssertionError("%s: body is not an OpenAI error: %r" % (name, data[:200]))
            assert st == status, (name, st, err)
            assert hdr.get("content-type") == "application/json", (name, hdr)
            assert set(err) == {"message", "type", "param", "code"}, (name, err)
            assert needle in err["message"], (name, needle, err["message"])
            assert err["param"] == param, (name, err["param"], param)
        # invalid UTF-8 in a message is the client's text, not a protocol error: served
        raw = b'{"messages": [{"role": "user", "content": "caf\xc3 \xff"}], "max_tokens": 4}'
        st, _, data = S.request("POST", chat_url, raw, headers={"Content-Type": "application/json"})
        assert st == 200, (st, data)
        json.loads(data)  # and the answer is valid JSON (valid UTF-8)
        # bodies over the limit: 413 from Content-Length (curl sends Expect: 100-continue) and from a chunked body
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            f.write(b'{"messages": [{"role": "user", "content": "' + b"a" * (5 << 20) + b'"}]}')
            f.flush()
            for extra in ([], ["-H", "Transfer-Encoding: chunked"]):
                rc, out, errb = curl("-o", "-", "-w", "\n%{http_code}", "-H", "Authorization: Bearer test-key",
                                     "-H", "Content-Type: application/json", *extra, "--data-binary", "@" + f.name,
                                     S.base + chat_url)
                body, code = out.rsplit(b"\n", 1)
                assert code == b"413", (extra, code, body[:200], errb)
                e = json.loads(body)["error"]
                assert e["code"] == "request_too_large" and "limit" in e["message"], e
        # and the server still serves
        st, data = S.json("POST", chat_url, {"messages": ok_msg, "max_tokens": 3})
        assert st == 200 and data["choices"][0]["message"]["role"] == "assistant", data
        m = S.metrics()
        return "%d cases; responses 400=%d 401=%d 404=%d 405=%d 413=%d" % (
            len(cases) + 3, m['gemma3_http_responses_total{code="400"}'], m['gemma3_http_responses_total{code="401"}'],
            m['gemma3_http_responses_total{code="404"}'], m['gemma3_http_responses_total{code="405"}'],
            m['gemma3_http_responses_total{code="413"}'])

    @r.test
    def test_curl_sse_framing():
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say something."}],
                           "max_tokens": 12, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        rc, out, err = curl("-N", "-i", "-H", "Authorization: Bearer test-key", "-H",
                            "Content-Type: application/json", "-d", body, S.base + "/v1/chat/completions")
        assert rc == 0, err
        head, _, payload = out.partition(b"\r\n\r\n")
        head = head.decode().lower()
        assert head.startswith("http/1.1 200"), head
        assert "content-type: text/event-stream" in head and "cache-control: no-cache" in head, head
        assert "transfer-encoding: chunked" in head, head
        assert b"\r" not in payload, "events are separated by \\n\\n only"
        assert payload.endswith(b"data: [DONE]\n\n"), payload[-80:]
        events = payload.split(b"\n\n")[:-1]
        assert all(e.startswith(b"data: ") and e.count(b"\n") == 0 for e in events), events[:3]
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, chunks[0]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1, chunks[-1]
        fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(fin) == 1 and fin[0]["choices"][0]["delta"] == {}, fin
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
        return "%d events" % len(events)

    @r.test
    def test_64_concurrent_streams_equal_sequential():
        prompts = ["Story %d: once there was a %s" % (i, ["cat", "ship", "tree", "king"][i % 4]) for i in range(64)]
        client = S.client(timeout=600)

        def stream_one(p, out, i):
            text, fin, n = "", None, 0
            for ch in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                                     max_tokens=32, temperature=0, stream=True,
                                                     stream_options={"include_usage": True}):
                if ch.usage:
                    n = ch.usage.completion_tokens
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    fin = ch.choices[0].finish_reason or fin
            out[i] = (text, fin, n)

        seq = [None] * 64
        t0 = time.time()
        for i, p in enumerate(prompts):
            stream_one(p, seq, i)
        t_seq = time.time() - t0

        conc = [None] * 64
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], S.metrics()["gemma3_requests_running"])
                time.sleep(0.01)

        w = threading.Thread(target=watch)
        w.start()
        threads = [threading.Thread(target=stream_one, args=(p, conc, i)) for i, p in enumerate(prompts)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        t_conc = time.time() - t0
        done.set()
        w.join()
        assert all(c is not None for c in conc), "every stream completed"
        diff = [i for i in range(64) if conc[i] != seq[i]]
        assert not diff, "outputs differ for %d prompts, e.g. %d: %r vs %r" % (len(diff), diff[0], conc[diff[0]],
                                                                              seq[diff[0]])
        toks = sum(c[2] for c in conc)
        assert wait_for(lambda: seq_blocks(S.metrics()) == 0), \
            "blocks not freed after the run (or the engine's kv_blocks_cached miscounts): %s" % {
                k: v for k, v in S.metrics().items() if "kv_blocks" in k}
        return ("64 streams identical to sequential; %d tokens; sequential %.2fs (%.0f tok/s), concurrent %.2fs "
                "(%.0f tok/s); peak running %d" % (toks, t_seq, toks / t_seq, t_conc, toks / t_conc, peak[0]))

    @r.test
    def test_disconnect_frees_blocks():
        srv = slow_server()
        notes = []
        for stream in (True, False):
            m0 = srv.metrics()
            s = open_stream(srv, long_chat(300, stream))
            if stream:
                buf = read_events(s, 3)
                assert buf.count(b"data: ") >= 3, buf
            else:  # no bytes until the end: wait until it runs
                assert wait_for(lambda: srv.metrics()["gemma3_requests_running"] == 1)
                assert wait_for(lambda: seq_blocks(srv.metrics()) > 0)
            used = seq_blocks(srv.metrics())
            assert used > 0
            t0 = time.time()
            s.close()
            m1 = wait_for(lambda: (lambda m: m if seq_blocks(m) == 0 and m[
                'gemma3_sequences_finished_total{reason="cancelled"}'] == m0[
                'gemma3_sequences_finished_total{reason="cancelled"}'] + 1 else None)(srv.metrics()), timeout=10)
            assert m1, "blocks not freed / not cancelled: %s" % srv.metrics()
            dt = time.time() - t0
            assert m1["gemma3_client_disconnects_total"] == m0["gemma3_client_disconnects_total"] + 1
            gen = m1["gemma3_generation_tokens_total"] - m0["gemma3_generation_tokens_total"]
            assert gen < 300, "generation stopped early (%d tokens)" % gen
            assert (m1["gemma3_kv_blocks_free"] + m1["gemma3_kv_blocks_used"] + m1["gemma3_kv_blocks_cached"]
                    == m1["gemma3_kv_blocks_total"])
            notes.append("%s: %d blocks freed %.0f ms after close, %d tokens generated" % (
                "stream" if stream else "non-stream", used, dt * 1e3, gen))
        return "; ".join(notes)

    @r.test
    def test_queue_full_gives_429():
        srv = slow_server()  # max-seqs 2 + max-queue 1
        socks = [open_stream(srv, long_chat(400)) for _ in range(3)]
        try:
            # two run (max-seqs 2), the third waits (the gauges follow at the engine thread's next step)
            m = wait_for(lambda: (lambda m: m if m["gemma3_sequences_outstanding"] == 3 and
                                  m["gemma3_requests_running"] == 2 and m["gemma3_queue_length"] == 1 else None)(
                srv.metrics()))
            assert m, srv.metrics()
            st, hdr, data = srv.request("POST", "/v1/chat/completions", long_chat(5, False))
            err = json.loads(data)["error"]
            assert st == 429 and err["code"] == "rate_limit_exceeded" and "busy" in err["message"], (st, err)
            # n=2 counts two sequences
            for s in socks[:1]:
                s.close()
            assert wait_for(lambda: srv.metrics()["gemma3_sequences_outstanding"] == 2)
            body = long_chat(5, False)
            body["n"] = 2
            st, _, data = srv.request("POST", "/v1/chat/completions", body)
            assert st == 429, (st, data)
        finally:
            for s in socks:
                s.close()
        assert wait_for(lambda: seq_blocks(srv.metrics()) == 0 and
                        srv.metrics()["gemma3_sequences_outstanding"] == 0)
        st, _, _ = srv.request("POST", "/v1/chat/completions", long_chat(3, False))
        assert st == 200
        stop_slow()

    @r.test
    def test_sigterm_finishes_in_flight_and_exits_0():
        srv = Server(MODEL_DIR, "--test-step-delay-ms", "25", "--quiet", "--grace", "20")
        s = open_stream(srv, long_chat(40))
        buf = read_events(s, 2)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # no new connections once stopping (refused, or 503 from a connection already accepted)
        try:
            st, _, _ = srv.request("GET", "/health", timeout=5)
            assert st == 503, st
        except OSError:
            pass
        while not buf.endswith(b"data: [DONE]\n\n") and not buf.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        s.close()
        rc = srv.stop()
        assert b"data: [DONE]" in buf and b'"finish_reason":"length"' in buf, buf[-300:]
        assert b'"error"' not in buf
        assert rc == 0, (rc, srv.log[-5:])
        assert any("stopped" in line for line in srv.log), srv.log[-5:]

    @r.test
    def test_sigterm_after_grace_cancels_and_exits_0():
        srv = Server(MODEL_DIR, "--test-step-delay-ms", "25", "--quiet", "--grace", "1")
        s = open_stream(srv, long_chat(400))
        buf = read_events(s, 2)
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        s.close()
        rc = srv.stop()
        dt = time.time() - t0
        assert rc == 0, (rc, srv.log[-5:])
        assert b"shutting down" in buf and b"data: [DONE]" in buf, buf[-400:]
        srv2 = Server(MODEL_DIR, "--quiet")
        rc2 = srv2.stop(signal.SIGINT)
        assert rc2 == 0, rc2
        return "in-flight stream cancelled and process exited %.1fs after SIGTERM (grace 1s)" % dt
