"""Fill README's full-SciFact block with the table ``htp-retrieval eval`` prints.

Run from the repo root after new full-split results land in ``results/``. Only methods with
a finished results JSON are listed, so the eval call reuses results and computes nothing.
The printed command reproduces the table (``--overwrite`` recomputes it).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from htp_retrieval.eval.data import BeirData
from htp_retrieval.eval.harness import DataItem, EvalSettings, RunPoint, result_paths
from htp_retrieval.methods import METHODS

MARK = re.compile(r"(<!-- scifact-full:start -->\n).*?(<!-- scifact-full:end -->)", re.S)


def main() -> None:
    """Rewrite the block between the ``scifact-full`` markers of README.md."""
    # each method's file under the shipped defaults; the published table is bf16, which
    # dtype auto gives only on some CPUs
    settings = EvalSettings(dtype="bfloat16")
    item = DataItem("retrieval", "scifact", "test", BeirData("scifact", {}, {}, {}))
    done = [m for m, spec in METHODS.items()
            if result_paths(settings, RunPoint(spec, 512), item)[1][0][2].exists()]
    missing = [m for m in METHODS if m not in done]
    cmd = ["htp-retrieval", "eval", "--data", "../shared/data/beir/scifact",
           "--methods", ",".join(done), "--dtype", "bfloat16"]
    out = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout
    table = "\n".join(line for line in out.splitlines() if line.startswith("|"))
    block = f"```bash\n{' '.join(cmd)}\n```\n\n{table}\n"
    if missing:
        block += ("\nNot in yet: " + ", ".join(f"`{m}`" for m in missing)
                  + " (their corpus encodes are checkpointed and resume with the same command"
                  " plus the method names).\n")
    readme = Path("README.md")
    readme.write_text(MARK.sub(lambda m: m.group(1) + block + m.group(2), readme.read_text()))
    print(f"README: {len(done)} methods, missing: {', '.join(missing) or 'none'}")


if __name__ == "__main__":
    main()
