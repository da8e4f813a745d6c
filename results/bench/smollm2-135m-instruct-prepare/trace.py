"""Overlap trace of the encode pipeline: preparation of later batches during the
forward pass of earlier ones, from ``EncodeStats.timeline`` / ``prepare_timeline``.

Usage (from the repository root): ``python3 PATH/trace.py N_DOCS WINDOW BATCH_SIZE``.
"""

import os
import sys

import numpy as np
import torch

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.bench import scifact_documents

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
n, window, bs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
docs = scifact_documents("../shared/data/beir/scifact", n)
enc = HTPEncoder("smollm2-135m-instruct", "htp", batch_size=bs)
enc.encode(docs[:2])
out = {}
for name, kw in (("off", {"pipeline": False, "prepare_window": window}),
                 ("on", {"pipeline": True, "prepare_window": window}),
                 ("off-all", {"pipeline": False}), ("on-all", {"pipeline": True})):
    v = enc.encode(docs, **kw)
    st = enc.last_stats
    out[name] = v
    fw, pr = st.timeline, st.prepare_timeline
    ov = sum(max(0.0, min(b, d) - max(a, c)) for a, b in pr for c, d in fw)
    ahead = sum(1 for i in range(1, len(fw)) if pr[i][1] <= fw[i - 1][1])
    print(f"## {name}: window {kw.get('prepare_window')} total {st.total_seconds:.2f}s, "
          f"wait {st.wait_seconds:.3f}s, prepare {st.prepare_seconds:.3f}s, "
          f"inputs {st.inputs_seconds:.3f}s, forward {st.forward_seconds:.2f}s, "
          f"{len(fw)} batches, preparation during a forward pass: {ov:.3f}s, batches ready "
          f"before the previous forward ended: {ahead}/{len(fw) - 1}")
    if name == "on":
        print("| batch | rows x width | prepare start-end (s) | forward start-end (s) |")
        print("|---|---|---|---|")
        for i, ((a, b), (c, d)) in enumerate(zip(pr, fw)):
            print(f"| {i} | {st.batches[i][0]} x {st.batches[i][1]} | {a:.3f}-{b:.3f} "
                  f"| {c:.3f}-{d:.3f} |")
cos = ((out["on"] * out["off-all"]).sum(1) / np.linalg.norm(out["on"], axis=1)
       / np.linalg.norm(out["off-all"], axis=1))
print("pipeline on == off (same window):", np.array_equal(out["on"], out["off"]),
      "; on == off (all at once):", np.array_equal(out["on-all"], out["off-all"]),
      "; window vs all: max abs diff", float(np.abs(out["on"] - out["off-all"]).max()),
      "max |x|", float(np.abs(out["off-all"]).max()), "min cosine", float(cos.min()))
