"""Research on HTP, kept apart from the packaged product: diagnosis, ablations, seeds.

Not packaged (pyproject's ``packages`` leave it out). Run from the repository root as
``python -m research <command> ...``; research/README.md lists the commands and
research/ANALYSIS.md has the findings. Modules here import ``htp_retrieval`` and
``htp_retrieval.eval``; nothing in the product imports them.
"""
