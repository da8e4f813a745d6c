"""htp-retrieval: Hierarchical Token Prepending (HTP) text embeddings from decoder-only LLMs.

Ding et al., "Hierarchical Token Prepending: Enhancing Information Flow in Decoder-based
LLM Embeddings", ACL 2026 (arXiv 2511.14868).
"""

from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING

# In a source checkout, ``htp_retrieval.eval`` and ``htp_retrieval.integrations`` live in
# ``eval/`` and ``integrations/`` beside this folder (pyproject's package-dir mapping); an
# installed copy has them inside it. When this module is imported from the checkout while
# the package is installed elsewhere (``python -m ...`` or ``python -c`` run from the
# repository root, with a non-editable install), look in the checkout root too, so those
# subpackages still import.
_root = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "eval").is_dir() and (_root / "eval" / "__init__.py").is_file():
    __path__.append(str(_root))  # noqa: F821 - the package's own search path

if _TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from htp_retrieval.centering import Centering, fit_centering
    from htp_retrieval.config import BlockPolicy, HTPConfig, LayerRange
    from htp_retrieval.encoder import BPST, PST, HTPEncoder
    from htp_retrieval.methods import ALIASES, METHODS, MethodSpec, get_method
    from htp_retrieval.models import DEFAULT_MODEL, PACKAGED, load_model
    from htp_retrieval.pipeline import EncodeStats

# Public names, imported on first use (PEP 562): ``import htp_retrieval`` and the CLI's
# ``--help`` and argument errors do not pay for importing torch and transformers. The
# static ``__all__`` below (for linters and type checkers) lists the same names;
# tests/core/test_package.py checks that they agree.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Centering", "fit_centering"), "htp_retrieval.centering"),
    **dict.fromkeys(("BlockPolicy", "HTPConfig", "LayerRange"), "htp_retrieval.config"),
    **dict.fromkeys(("BPST", "PST", "HTPEncoder"), "htp_retrieval.encoder"),
    "EncodeStats": "htp_retrieval.pipeline",
    **dict.fromkeys(("ALIASES", "METHODS", "MethodSpec", "get_method"), "htp_retrieval.methods"),
    **dict.fromkeys(("DEFAULT_MODEL", "PACKAGED", "load_model"), "htp_retrieval.models"),
}

__version__ = "0.1.0"
__all__ = [
    "HTPEncoder", "HTPConfig", "Centering", "fit_centering", "BlockPolicy", "LayerRange", "EncodeStats", "PST", "BPST", "MethodSpec", "METHODS", "ALIASES",
    "get_method", "load_model", "PACKAGED", "DEFAULT_MODEL", "__version__",
]


def __getattr__(name: str) -> object:
    """Import a public name's module on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'htp_retrieval' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
