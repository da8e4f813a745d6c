"""Preparation throughput (HTPEncoder.build_layouts) on one core; runs on any commit."""
import os
import statistics
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])  # e.g. an export of an older commit's package
try:
    from htp_retrieval.eval.bench import long_documents, scifact_documents
except ImportError:  # a package from before bench.py moved to eval/
    from htp_retrieval.bench import long_documents, scifact_documents
from htp_retrieval.encoder import HTPEncoder

data = "../shared/data/beir/scifact"  # run from the repository root
N, NL = int(os.environ.get("N_DOCS", 256)), int(os.environ.get("N_LONG", 8))
docs = scifact_documents(data, N)
for method in ("htp", "vanilla-mean"):
    enc = HTPEncoder("smollm2-135m-instruct", method, dtype="bfloat16")
    long = long_documents(scifact_documents(data), enc.tokenizer, length=8192, n=NL)
    _ = enc.segmenter  # loaded outside the timing
    t0 = time.perf_counter()
    enc.build_layouts(docs)  # the first pass over these texts; warms spaCy's vocabulary
    print(f"{method} first pass over the 512-token texts: {time.perf_counter() - t0:.3f} s")
    for length, texts in ((512, docs), (8192, long)):
        enc.max_length = length
        secs = []
        for _ in range(int(os.environ.get("REPEATS", 7))):
            t0 = time.perf_counter()
            lays = enc.build_layouts(texts)
            secs.append(time.perf_counter() - t0)
        tokens = sum(lay.n_text_tokens for lay in lays)
        med = statistics.median(secs)
        print(f"{method} {length}: {len(texts)} texts, {tokens} text tokens, "
              f"median {med:.3f} s, {tokens / med:,.0f} text tokens/s")
