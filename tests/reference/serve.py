#!/usr/bin/python3
"""reference.py and train_reference.py for a whole test suite in one process.

Importing torch takes about 2 s here, and tst_reference compares some thirty dumps: it starts this once and
sends each comparison as a request. Reads one JSON object a line on stdin,
    {"script": "reference" | "train", "args": ["DUMP_DIR", ...]}
runs that script's main(args) and writes one JSON line back, {"code": EXIT_CODE, "output": TEXT}, TEXT being
what the script printed (stdout and stderr, in order). Prints {"ready": true} once torch is imported; ends at
the end of its input. A script that raises answers with code 1 and the traceback, as the interpreter would.
"""
import contextlib
import io
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402  (imports torch)
import train_reference  # noqa: E402

SCRIPTS = {"reference": reference.main, "train": train_reference.main}


def answer(request):
    script = SCRIPTS.get(request.get("script"))
    if script is None:
        return {"code": 2, "output": f"serve.py: unknown script {request.get('script')!r}\n"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = script([str(a) for a in request.get("args", [])])
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
        except Exception:  # noqa: BLE001  (reported to the test, which fails on it)
            traceback.print_exc()
            code = 1
    return {"code": int(code or 0), "output": out.getvalue()}


def main():
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as e:
            reply = {"code": 2, "output": f"serve.py: a request is not JSON: {e}\n"}
        else:
            reply = answer(request)
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
