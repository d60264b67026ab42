"""Run one README snippet (``<!-- snippet: NAME -->``) as written against a
fresh ``vectide serve``.

``python run_snippet.py NAME`` with the framework's venv python
(``$VECTIDE_BIN`` names the vectide binary): starts the server, runs the
snippet's code as a script of its own with ``VECTIDE_URL`` pointing at the
server (the snippet reads it, with ``http://localhost:6333`` as default),
stops the server and prints one JSON line; the exit code is the snippet's
(3 if it tried to reach anything outside loopback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fwcommon as fw


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: run_snippet.py NAME")
    name = sys.argv[1]
    source, code = fw.snippet_source(name)
    t0 = time.monotonic()
    with fw.VectideServer() as server, tempfile.TemporaryDirectory(prefix=f"snippet-{name}-") as tmp:
        script = Path(tmp) / f"{name}_snippet.py"
        script.write_text(code)
        # the snippet runs as written; a sitecustomize beside it only watches
        # for network access outside loopback (exit status 3 if any)
        (Path(tmp) / "sitecustomize.py").write_text("import fwcommon\nfwcommon.exit_nonzero_on_network_attempts()\n")
        path = os.pathsep.join([tmp, str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, VECTIDE_URL=server.url, PYTHONPATH=path.rstrip(os.pathsep))
        r = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
    sys.stderr.write(r.stdout + r.stderr)
    print(json.dumps({"snippet": name, "source": str(source), "returncode": r.returncode,
                      "seconds": round(time.monotonic() - t0, 2)}), flush=True)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
