"""Entry point of the server tests: starts the shared `gemma3 serve` on the small-a fixture, or, where that fixture
is absent (a clean clone), on the demo model models/gemma3-pydoc that ships in the repository, and runs the API and
robustness suites. Tests whose premise is a fact of small-a that the fallback model lacks are skipped with the
reason printed. Usage: python test_server.py [test_name ...]; prints one line per test and "N passed, N failed".
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import test_api  # noqa: E402
import test_robust  # noqa: E402


def main():
    model = harness.fixture("small-a")
    small_a = model is not None
    if not small_a:
        model = os.path.join(harness.ROOT, "models", "gemma3-pydoc")
    if not os.path.isdir(model) or not os.path.exists(harness.BIN):
        print("skipped: no small-a fixture (G3_FIXTURES), no %s, or no gemma3 binary at %s" % (model, harness.BIN))
        print("0 passed, 0 failed")
        return 0
    model = os.path.abspath(model)
    name = os.path.basename(model.rstrip("/"))
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    print("model: %s (%s)%s" % (name, model, "" if small_a else
                                ": the small-a fixture is absent, so the suite runs on the demo model that ships in "
                                "the repository; checks on facts of small-a take them from this model or are skipped with the reason"), flush=True)
    srv = harness.Server(model, "--quiet", max_seqs=64)
    for m in (test_api, test_robust):
        m.S, m.MODEL, m.MODEL_DIR, m.SMALL_A, m.VOCAB = srv, name, model, small_a, vocab
    r = harness.Runner()
    test_api.register(r)
    test_robust.register(r)
    try:
        rc = r.run(set(sys.argv[1:]) or None)
    finally:
        test_robust.stop_slow()
        code = srv.stop()
        if code != 0:
            print("FAIL shared server exited with %s" % code)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
