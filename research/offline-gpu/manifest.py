"""sha256 of every tensor's raw bytes in a safetensors file: make it here, check it there.

``python manifest.py make OUT.json NAME PATH [NAME PATH ...]`` hashes each model;
``python manifest.py check OUT.json NAME PATH`` exits 1 if a tensor other than
``lm_head.weight`` (never read by the embedders; zeroed in transfer to save bytes)
differs.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys


def tensor_hashes(path: str) -> dict[str, list]:
    """``name -> [dtype, shape, sha256 of the raw bytes]`` for every tensor in ``path``."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        out = {}
        for name, meta in sorted(header.items()):
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            f.seek(8 + n + a)
            out[name] = [meta["dtype"], meta["shape"], hashlib.sha256(f.read(b - a)).hexdigest()]
    return out


def main(argv: list[str]) -> int:
    mode, manifest = argv[0], argv[1]
    if mode == "make":
        res = {name: tensor_hashes(p) for name, p in zip(argv[2::2], argv[3::2], strict=True)}
        with open(manifest, "w") as f:
            json.dump(res, f)
        return 0
    name, path = argv[2], argv[3]
    with open(manifest) as f:
        ref = json.load(f)[name]
    got = tensor_hashes(path)
    bad = [k for k in ref if k != "lm_head.weight" and got.get(k) != ref[k]]
    print(f"{name}: {len(ref)} tensors in the CPU cache, {len(got)} here; mismatched "
          f"(lm_head excluded): {bad}; only here: {sorted(set(got) - set(ref))}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
