"""Batches and waits of prepare_workers against one sorted call, on CPU with a 2-layer
random model (`python mktiny.py` first), so the forward pass is short as on a GPU.

usage: python pool_batches.py METHODS PENDING...   e.g. python pool_batches.py vanilla-mean,htp 2 8
"""
import json
import sys
import time

import htp_retrieval.encoder as E
from htp_retrieval import HTPEncoder


def main() -> None:
    docs = [json.loads(line) for line, _ in zip(open("../shared/data/beir/scifact/corpus.jsonl"), range(256))]
    texts = [d["title"] + " " + d["text"] for d in docs]
    for m in sys.argv[1].split(","):
        for pending in [None] + [int(p) for p in sys.argv[2:]]:
            w = 0 if pending is None else 2
            if pending is not None:
                E.POOL_PENDING_BATCHES = pending
            e = HTPEncoder("/tmp/tiny/smol-tiny", m, max_length=512, dtype="float32", prepare_workers=w)
            e.encode(texts[:4])
            e.encode(texts[100:140])
            for _ in range(2):
                t = time.perf_counter()
                e.encode(texts)
                dt = time.perf_counter() - t
            s = e.last_stats
            print(f"{m} workers={w} pending={pending} s={dt:.3f} wait={s.wait_seconds:.3f} "
                  f"forward={s.forward_seconds:.3f} batches={len(s.batches)} padding={s.padding_fraction:.3f}")
            e.close()


if __name__ == "__main__":
    main()
