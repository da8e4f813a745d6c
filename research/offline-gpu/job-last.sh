#!/bin/bash
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-last-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
r htp-retrieval eval --quiet --output results/h100 --data needle --context-lengths 8192 --methods htp
r htp-retrieval eval --quiet --output results/h100 --data passkey --context-lengths 8192 --methods htp
r htp-retrieval eval --quiet --output results/h100 --data ../shared/data/longembed/qmsum --max-length 8192 --methods htp
