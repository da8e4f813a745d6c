#!/bin/bash
Q="htp-retrieval eval --model qwen2.5-coder-0.5b-instruct --quiet"
A="--output research/results/analysis-h100 --max-blocks 32 --min-block-tokens 64 --long-budget 1024:4"
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-qwen-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
r $Q --output results/h100 --data ../shared/data/longembed/qmsum --max-length 8192 --methods vanilla-mean,tp-mean
r $Q --output results/h100 --data ../shared/data/longembed/qmsum --max-length 8192 --methods htp --long-budget 1024:4
r $Q $A --data needle --context-lengths 4096 --methods tp-sentence,htp-last
r $Q --output research/results/analysis-h100 --data needle --context-lengths 4096 --methods vanilla-mean
r $Q --output research/results/analysis-h100 --data needle --context-lengths 4096 --methods htp --long-budget 1024:4
r $Q $A --data needle --context-lengths 2048,8192 --methods tp-sentence,htp-last
r $Q --output research/results/analysis-h100 --data needle --context-lengths 2048,8192 --methods vanilla-mean
r $Q --output research/results/analysis-h100 --data needle --context-lengths 2048,8192 --methods htp --long-budget 1024:4
r $Q $A --data passkey --context-lengths 4096,8192 --methods tp-sentence,htp-last
r $Q --output research/results/analysis-h100 --data passkey --context-lengths 4096,8192 --methods vanilla-mean
r $Q --output research/results/analysis-h100 --data passkey --context-lengths 4096,8192 --methods htp --long-budget 1024:4
r htp-retrieval bench --model qwen2.5-coder-0.5b-instruct --device cuda --lengths 512,8192,32768 --repeats 3 --quiet --output results/bench/qwen2.5-coder-0.5b-instruct-h100
