"""Entry point of the server tests: starts the shared `gemma3 serve` on the small-a fixture and runs the API and
robustness suites. Usage: python test_server.py [test_name ...]; prints one line per test and "N passed, N failed".
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import test_api  # noqa: E402
import test_robust  # noqa: E402


def main():
    model = harness.fixture("small-a")
    if model is None or not os.path.exists(harness.BIN):
        print("skipped: no small-a fixture (G3_FIXTURES) or no gemma3 binary at %s" % harness.BIN)
        print("0 passed, 0 failed")
        return 0
    srv = harness.Server(model, "--quiet", max_seqs=64)
    name = os.path.basename(model.rstrip("/"))
    test_api.S = test_robust.S = srv
    test_api.MODEL = test_robust.MODEL = name
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
