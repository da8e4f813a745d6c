"""Seconds per 1,000 chunks, naive chunks vs late chunking, on the device (timing only)."""
import json
import sys
import time

import torch

from htp_retrieval import HTPEncoder
from htp_retrieval.chunking import Chunk

model, path = sys.argv[1], sys.argv[2]
device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
limit = int(sys.argv[4]) if len(sys.argv) > 4 else None
data = json.load(open(path))
docs = data["texts"][:limit]
chunks = [[Chunk(*c) for c in cs] for cs in data["chunks"]][:limit]


def sync() -> None:
    if device == "cuda":
        torch.cuda.synchronize()

flat = [d[c.start:c.end] for d, cs in zip(docs, chunks) for c in cs]
n = len(flat)
print(f"{len(docs)} meetings, {n} chunks of <= 256 tokens")
for method in ("vanilla-mean", "htp"):
    enc = HTPEncoder(model, method, device=device)
    enc.encode(flat[:64])
    enc.encode_late_chunks(docs[:1], chunks[:1])
    for rep in range(2):
        sync()
        t = time.perf_counter()
        enc.encode(flat)
        sync()
        naive = time.perf_counter() - t
        tok_naive = enc.last_stats.text_tokens
        t = time.perf_counter()
        enc.encode_late_chunks(docs, chunks)
        sync()
        late = time.perf_counter() - t
        tok_late = enc.last_stats.text_tokens
        print(f"{method} repeat {rep}: naive {naive:.2f} s ({1000 * naive / n:.2f} s / 1,000 "
              f"chunks, {tok_naive} text tokens), late {late:.2f} s "
              f"({1000 * late / n:.2f} s / 1,000 chunks, {tok_late} text tokens, windows of "
              f"{enc.max_length} tokens)")
