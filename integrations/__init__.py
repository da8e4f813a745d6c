"""Framework integrations (importable as ``htp_retrieval.integrations``).

Names are imported lazily, so importing this package needs no framework:

* :class:`HTPEmbeddings` (``htp_retrieval.integrations.embeddings``): LangChain and
  LlamaIndex embeddings (extras ``langchain`` and ``llamaindex``).
* :class:`HTPEmbeddingFunction`, :func:`ingest`, :func:`query`
  (``htp_retrieval.integrations.chroma``): Chroma (extra ``chroma``).
* :func:`ingest_ray` (``htp_retrieval.integrations.ray_ingest``): distributed ingestion
  into a Chroma server on Ray Data (extra ``ray``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "HTPEmbeddings": "htp_retrieval.integrations.embeddings",
    "HTPEmbeddingFunction": "htp_retrieval.integrations.chroma",
    "ingest": "htp_retrieval.integrations.chroma",
    "query": "htp_retrieval.integrations.chroma",
    "IngestReport": "htp_retrieval.integrations.chroma",
    "ingest_ray": "htp_retrieval.integrations.ray_ingest",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = list(_LAZY)
