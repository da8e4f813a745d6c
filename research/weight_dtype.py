"""Whether the cached bf16 weights change float32 results: ``weights-dtype``.

A packaged model's GGUF is converted once to bf16 safetensors (:mod:`htp_retrieval.models`),
so a ``dtype="float32"`` run computes in float32 on the GGUF's dequantized weights rounded to
bf16. This command converts the same GGUF at float32 into a scratch folder, reports the
relative L2 error of every bf16 tensor against it, and embeds the first N documents of a
BEIR corpus with both copies in float32 (one cosine per document and method), so the
float32 rows' dtype effects can be told apart from the storage's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _convert_float32(model: str, target: Path) -> None:
    """Convert packaged ``model``'s GGUF to float32 safetensors in ``target``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from htp_retrieval.models import packaged_gguf

    gguf = packaged_gguf(model)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                              dtype=torch.float32)
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(target)
    tok.save_pretrained(target)


def compare(model: str, data: str, n_texts: int, methods: list[str]) -> dict[str, Any]:
    """Compare the cached bf16 weights of packaged ``model`` with a float32 conversion.

    Returns a dict with per-tensor relative L2 errors (``weights``: median and max over
    tensors) and, per method, the cosine between the two copies' float32 embeddings of the
    first ``n_texts`` documents of ``data/corpus.jsonl`` (min and mean over documents).

    Raises:
        KeyError: ``model`` is not a packaged model name.
        FileNotFoundError: ``data`` has no ``corpus.jsonl``.
    """
    import torch
    from safetensors.torch import load_file

    from htp_retrieval import HTPEncoder
    from htp_retrieval.models import resolve_model_path

    corpus = Path(data) / "corpus.jsonl"
    if not corpus.is_file():
        raise FileNotFoundError(f"weights-dtype: no corpus.jsonl in {data}")
    texts = []
    with corpus.open() as f:
        for line in f:
            if len(texts) == n_texts:
                break
            rec = json.loads(line)
            texts.append(((rec.get("title") or "") + " " + rec["text"]).strip())
    cached = Path(resolve_model_path(model)[0])
    out: dict[str, Any] = {"model": model, "data": data, "n_texts": len(texts),
                           "compute_dtype": "float32"}
    with tempfile.TemporaryDirectory(prefix="weights-fp32-") as tmp:
        _convert_float32(model, Path(tmp))
        a = load_file(str(Path(tmp) / "model.safetensors"))
        b = load_file(str(cached / "model.safetensors"))
        rel = sorted(float((a[k].float() - b[k].float()).norm() / a[k].float().norm())
                     for k in a if a[k].float().norm() > 0)
        out["weights"] = {"tensors": len(rel), "stored_dtype": str(b[next(iter(b))].dtype),
                          "relative_l2_median": rel[len(rel) // 2], "relative_l2_max": rel[-1]}
        out["cosine"] = {}
        for method in methods:
            e32 = torch.as_tensor(HTPEncoder(tmp, method=method, dtype="float32").encode(texts))
            e16 = torch.as_tensor(HTPEncoder(model, method=method, dtype="float32").encode(texts))
            cos = torch.nn.functional.cosine_similarity(e32, e16)
            out["cosine"][method] = {"min": float(cos.min()), "mean": float(cos.mean())}
    return out


def cmd_weights_dtype(args: argparse.Namespace) -> int:
    """Run :func:`compare`, print it and write ``<output>/weights-dtype-<model>.json``."""
    res = compare(args.model, args.data, args.n_texts, args.methods.split(","))
    res["command"] = "python -m research " + " ".join(sys.argv[1:])
    res["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    w = res["weights"]
    print(f"{res['model']}: {w['tensors']} tensors stored in {w['stored_dtype']}, relative L2 "
          f"error against float32: median {w['relative_l2_median']:.2e}, "
          f"max {w['relative_l2_max']:.2e}")
    for m, c in res["cosine"].items():
        print(f"  {m}: cosine of float32 embeddings, float32 weights vs cached: "
              f"min {c['min']:.7f}, mean {c['mean']:.7f} ({res['n_texts']} documents)")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"weights-dtype-{res['model']}.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


def add_parser(asub: Any) -> None:
    """Register ``weights-dtype`` on the ``python -m research`` subparsers."""
    q = asub.add_parser("weights-dtype", help="whether the cached bf16 weights change float32 "
                        "embeddings (against a float32 conversion of the same GGUF)")
    q.add_argument("--model", default="smollm2-135m-instruct", help="a packaged model name")
    q.add_argument("--data", default="../shared/data/beir/scifact")
    q.add_argument("--n-texts", type=int, default=48)
    q.add_argument("--methods", default="vanilla-mean,htp")
    q.add_argument("--output", default="research/results/fp32-cpu")
    q.set_defaults(func=cmd_weights_dtype)
