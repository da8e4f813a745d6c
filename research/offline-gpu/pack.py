"""Split what an offline GPU machine needs into pieces of at most CAP bytes, one folder per call.

Run from the repository root after filling ``.whl/`` (wheels the machine lacks),
``.dev/pkgw/`` (this package's wheel) and ``.dev/stage/`` (``data.tar.xz``,
``manifest.json``, the ``.gguf.xz`` weights) and ``.dev/tok.tar.xz``. Writes
``.dev/c01``, ``.dev/c02``, ... (carry one per call) and ``.dev/bin/parts.json`` (how
``step.sh`` reassembles them). CAP leaves room for the tracked tree under the 64 MiB
that one call may carry.
"""

from __future__ import annotations

import json
import os
import shutil

CAP = 55_000_000


def items() -> list[tuple[str, str]]:
    """``(source path, name on the machine)`` in the order they should arrive."""
    whl = sorted(os.listdir(".whl"))
    out = [(f".whl/{f}", f"whl/{f}") for f in whl if not f.startswith("transformers")]
    out += [(f".whl/{f}", f"whl/{f}") for f in whl if f.startswith("transformers")]
    out += [(f".dev/pkgw/{f}", f"pkg/{f}") for f in os.listdir(".dev/pkgw")]
    out += [(".dev/stage/data.tar.xz", "data.tar.xz"), (".dev/tok.tar.xz", "tok.tar.xz"),
            (".dev/stage/manifest.json", "manifest.json"),
            (".dev/stage/SmolLM2-135M-Instruct.Q4_1.gguf.xz", "smol.gguf.xz"),
            (".dev/stage/qwen-z.gguf.xz", "qwen.gguf.xz")]
    return out


def main() -> None:
    calls: list[list[tuple[str, int, int, str]]] = []
    cur: list[tuple[str, int, int, str]] = []
    room = CAP
    parts: dict[str, list[str]] = {}
    for src, dst in items():
        size, off, k = os.path.getsize(src), 0, 0
        while off < size:
            if room <= 1_000_000:
                calls.append(cur)
                cur, room = [], CAP
            n = min(room, size - off)
            piece = f"{dst.replace('/', '__')}.p{k:02d}"
            cur.append((src, off, n, piece))
            parts.setdefault(dst, []).append(piece)
            off, room, k = off + n, room - n, k + 1
    calls.append(cur)
    for i, call in enumerate(calls, 1):
        d = f".dev/c{i:02d}"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for src, off, n, piece in call:
            with open(src, "rb") as r, open(f"{d}/{piece}", "wb") as w:
                r.seek(off)
                w.write(r.read(n))
        print(d, sum(x[2] for x in call), "bytes,", len(call), "pieces")
    with open(".dev/bin/parts.json", "w") as f:
        json.dump(parts, f, indent=0)


if __name__ == "__main__":
    main()
