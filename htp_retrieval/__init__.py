"""htp-retrieval: Hierarchical Token Prepending (HTP) text embeddings from decoder-only LLMs.

Ding et al., "Hierarchical Token Prepending: Enhancing Information Flow in Decoder-based
LLM Embeddings", ACL 2026 (arXiv 2511.14868).
"""

from pathlib import Path as _Path

# In a source checkout, ``htp_retrieval.eval`` and ``htp_retrieval.integrations`` live in
# ``eval/`` and ``integrations/`` beside this folder (pyproject's package-dir mapping); an
# installed copy has them inside it. When this module is imported from the checkout while
# the package is installed elsewhere (``python -m ...`` or ``python -c`` run from the
# repository root, with a non-editable install), look in the checkout root too, so those
# subpackages still import.
_root = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "eval").is_dir() and (_root / "eval" / "__init__.py").is_file():
    __path__.append(str(_root))  # noqa: F821 - the package's own search path

from htp_retrieval.centering import Centering, fit_centering  # noqa: E402
from htp_retrieval.config import BlockPolicy, HTPConfig, LayerRange  # noqa: E402
from htp_retrieval.encoder import BPST, PST, EncodeStats, HTPEncoder  # noqa: E402
from htp_retrieval.methods import ALIASES, METHODS, MethodSpec, get_method  # noqa: E402
from htp_retrieval.models import DEFAULT_MODEL, PACKAGED, load_model  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "HTPEncoder", "HTPConfig", "Centering", "fit_centering", "BlockPolicy", "LayerRange", "EncodeStats", "PST", "BPST", "MethodSpec", "METHODS", "ALIASES",
    "get_method", "load_model", "PACKAGED", "DEFAULT_MODEL", "__version__",
]
