#!/bin/bash
M=vanilla-mean,vanilla-last,prompteol-last,tp-prompteol-last,tp-mean,tp-sentence,htp-last,htp-fixed-tokens
E="htp-retrieval eval --quiet --output results/h100"
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-smol-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
r $E --data needle --context-lengths 8192 --methods $M
r $E --data needle --context-lengths 8192 --methods htp --max-blocks 8
r $E --data passkey --context-lengths 8192 --methods $M
r $E --data passkey --context-lengths 8192 --methods htp --max-blocks 8
r $E --data ../shared/data/longembed/qmsum --max-length 8192 --methods $M
r $E --data ../shared/data/longembed/qmsum --max-length 8192 --methods htp --max-blocks 8
r htp-retrieval bench --device cuda --lengths 512,2048,8192 --repeats 3 --quiet --output results/bench/smollm2-135m-instruct-h100
