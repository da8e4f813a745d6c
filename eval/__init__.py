"""Evaluation harness for htp-retrieval (importable as ``htp_retrieval.eval``).

BEIR-format retrieval with pytrec_eval metrics, cost measurement (encode time, tokens/s,
peak memory) and one results JSON per model/method/dataset.
"""

from htp_retrieval.eval.data import BeirData, load_beir, subsample
from htp_retrieval.eval.metrics import evaluate_run
from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval

__all__ = ["BeirData", "load_beir", "subsample", "evaluate_run", "run_retrieval",
           "RetrievalResult"]
