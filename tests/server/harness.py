"""Test harness for `gemma3 serve`: starts a server on 127.0.0.1 with a free port on a fixture model, raw HTTP
helpers, a /metrics reader and a tiny test runner that prints one line per test and "N passed, N failed"."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

ROOT = os.environ.get("G3_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("G3_BIN") or os.path.join(ROOT, "build", "gemma3")


def fixture(name):
    """tests/data/NAME, $G3_FIXTURES/NAME or ../shared/fixtures/NAME (as tu_fixture does); None if absent."""
    cands = [os.path.join(ROOT, "tests", "data", name)]
    if os.environ.get("G3_FIXTURES"):
        cands.append(os.path.join(os.environ["G3_FIXTURES"], name))
    cands.append(os.path.join(ROOT, "..", "shared", "fixtures", name))
    for c in cands:
        if os.path.isdir(c):
            return os.path.abspath(c)
    return None


class Server:
    """A running `gemma3 serve` process. Use as a context manager; stop() sends SIGTERM and returns the exit code."""

    def __init__(self, model, *extra, api_key="test-key", ctx=512, max_seqs=8, ready=True):
        self.api_key = api_key
        self.ctx = ctx
        args = [BIN, "serve", "-m", model, "--port", "0", "--ctx-size", str(ctx), "--max-seqs", str(max_seqs),
                "--threads", os.environ.get("G3_TEST_THREADS", "2")]
        if api_key:
            args += ["--api-key", api_key]
        args += list(extra)
        self.args = args
        self.log = []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.port = None
        got_port = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got_port.set()
            got_port.set()

        self.reader = threading.Thread(target=drain, daemon=True)
        self.reader.start()
        if not got_port.wait(60) or self.port is None:
            self.kill()
            raise RuntimeError("server did not start: " + " | ".join(self.log[-10:]))
        self.base = "http://127.0.0.1:%d" % self.port
        if ready:
            self.wait_ready()

    def wait_ready(self, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + " | ".join(self.log[-10:]))
            try:
                st, _, _ = self.request("GET", "/health")
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server not ready after %ds" % timeout)

    def request(self, method, path, body=None, headers=None, auth=True, timeout=120):
        """Raw HTTP request; returns (status, headers dict (lower-case names), body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {}
        if auth and self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, path, body=None, **kw):
        st, _, data = self.request(method, path, body, **kw)
        return st, json.loads(data) if data else None

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        assert st == 200, st
        out = {}
        for line in data.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
        return out

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "none", max_retries=0, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.stop()


def wait_for(pred, timeout=20, every=0.02):
    """Polls pred() until it returns a true value; returns it, or the last value after timeout."""
    t0 = time.time()
    v = pred()
    while not v and time.time() - t0 < timeout:
        time.sleep(every)
        v = pred()
    return v


class Skip(Exception):
    """Raised by a test whose premise does not hold for the model under test; printed with its reason, counted
    apart (neither passed nor failed)."""


class Runner:
    def __init__(self):
        self.tests = []
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def test(self, fn):
        self.tests.append(fn)
        return fn

    def run(self, selected=None):
        for fn in self.tests:
            if selected and fn.__name__ not in selected:
                continue
            t0 = time.time()
            try:
                note = fn()
                self.passed += 1
                print("ok   %s (%.1fs)%s" % (fn.__name__, time.time() - t0, (": " + note) if note else ""),
                      flush=True)
            except Skip as e:
                self.skipped += 1
                print("skip %s: %s" % (fn.__name__, e), flush=True)
            except Exception as e:  # a failed assert or an unexpected error: both fail the test
                self.failed += 1
                print("FAIL %s (%.1fs): %s: %s" % (fn.__name__, time.time() - t0, type(e).__name__, e), flush=True)
                traceback.print_exc(file=sys.stdout)
        print("%d passed, %d failed%s" % (self.passed, self.failed,
                                          ", %d skipped" % self.skipped if self.skipped else ""), flush=True)
        return 0 if self.failed == 0 else 1
