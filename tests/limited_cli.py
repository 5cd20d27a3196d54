"""The `fabriclab` CLI under a 1 GB address-space limit (RLIMIT_AS), for the input-hardening tests.

    python -m tests.limited_cli topo check FILE   one command, exactly as `fabriclab` runs it
    python -m tests.limited_cli                   many commands, one per line on stdin (a JSON list of
                                                  arguments), one JSON answer per line on stdout

The limit applies to this process only, so a runaway input fails here (MemoryError) and not in the
test runner. The serving mode spares the property tests a Python start-up per example; an exception
that escapes the CLI (a MemoryError, a RecursionError, any traceback) is reported in the answer as
`uncaught`, which is exactly what the tests look for.
"""
from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import traceback

LIMIT_AS_BYTES = 1 << 30


def serve() -> None:
    from fabriclab.cli import main

    for line in sys.stdin:
        out, err = io.StringIO(), io.StringIO()
        rc: int | None = None
        uncaught = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(json.loads(line))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - the point: report whatever escapes
            uncaught = traceback.format_exc()
        sys.stdout.write(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
                                     "uncaught": uncaught}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS_BYTES, LIMIT_AS_BYTES))
    if len(sys.argv) > 1:
        from fabriclab.cli import main

        sys.exit(main(sys.argv[1:]))
    serve()
