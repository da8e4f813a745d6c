"""Importing the package from a source checkout whose copy is installed elsewhere."""

from __future__ import annotations

import os
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


LAZY = """
import sys
import htp_retrieval
assert "torch" not in sys.modules, "import htp_retrieval imported torch"
assert set(htp_retrieval.__all__) <= set(dir(htp_retrieval))
assert sorted(htp_retrieval.__all__) == sorted([*htp_retrieval._EXPORTS, "__version__"])
try:
    htp_retrieval.HTPEncodr
except AttributeError as e:
    print(e)
from htp_retrieval import DEFAULT_MODEL, HTPEncoder
print(DEFAULT_MODEL, HTPEncoder.__module__, "torch" in sys.modules)
from htp_retrieval.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
"""


def test_public_names_import_on_first_use() -> None:
    """``import htp_retrieval`` (and so the CLI's ``--help`` and argument errors) does not
    import torch; each public name imports its module when first used."""
    out = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "module 'htp_retrieval' has no attribute 'HTPEncodr'"
    assert lines[1] == "smollm2-135m-instruct htp_retrieval.encoder True"
    assert "usage: htp-retrieval" in out.stdout
    help_only = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom htp_retrieval.cli import main\n"
         "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
         "print('torch' in sys.modules)"], capture_output=True, text=True, cwd=ROOT,
        timeout=300)
    assert help_only.stdout.strip().splitlines()[-1] == "False", help_only.stderr[-2000:]


def test_cli_turns_tokenizer_parallelism_on_unless_set() -> None:
    """The CLI lets the Rust tokenizer encode a batch on every core
    (``TOKENIZERS_PARALLELISM=true``) unless the user set the variable."""
    code = ("import os\nfrom htp_retrieval.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint(os.environ['TOKENIZERS_PARALLELISM'])")
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    for value, expected in ((None, "true"), ("false", "false")):
        run_env = env if value is None else {**env, "TOKENIZERS_PARALLELISM": value}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, env=run_env, timeout=300)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-2000:]
