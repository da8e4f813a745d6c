"""htp-retrieval: Hierarchical Token Prepending (HTP) text embeddings from decoder-only LLMs.

Ding et al., "Hierarchical Token Prepending: Enhancing Information Flow in Decoder-based
LLM Embeddings", ACL 2026 (arXiv 2511.14868).
"""

from htp_retrieval.encoder import BPST, PST, EncodeStats, HTPEncoder
from htp_retrieval.methods import ALIASES, METHODS, MethodSpec, get_method
from htp_retrieval.models import DEFAULT_MODEL, PACKAGED, load_model

__version__ = "0.1.0"
__all__ = [
    "HTPEncoder", "EncodeStats", "PST", "BPST", "MethodSpec", "METHODS", "ALIASES",
    "get_method", "load_model", "PACKAGED", "DEFAULT_MODEL", "__version__",
]
