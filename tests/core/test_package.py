"""Importing the package from a source checkout whose copy is installed elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Simulates a non-editable install run from the repository root: the checkout's
# ``htp_retrieval/`` comes first on sys.path and no editable-install finder maps the
# subpackages that live in ``eval/`` and ``integrations/``.
SCRIPT = f"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if 'editable' not in getattr(f, '__name__', type(f).__name__).lower()]
sys.path.insert(0, {str(ROOT)!r})
import htp_retrieval
import htp_retrieval.eval.harness as harness
import htp_retrieval.integrations as integrations
print(htp_retrieval.__file__)
print(harness.__file__)
print(integrations.__file__)
"""


def test_checkout_subpackages_import_without_the_editable_finder() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pkg, harness, integrations = out.stdout.strip().splitlines()[-3:]
    assert Path(pkg) == ROOT / "htp_retrieval" / "__init__.py"
    assert Path(harness) == ROOT / "eval" / "harness.py"
    assert Path(integrations) == ROOT / "integrations" / "__init__.py"
