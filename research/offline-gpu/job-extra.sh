#!/bin/bash
Q="htp-retrieval eval --model qwen2.5-coder-0.5b-instruct --quiet"
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-extra-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
r $Q --output results/h100 --data ../shared/data/longembed/qmsum --max-length 512 --methods vanilla-mean,tp-mean,htp
r $Q --output results/h100 --data needle --context-lengths 256,512,1024,2048,4096,8192 --methods vanilla-mean,tp-mean
r $Q --output results/h100 --data needle --context-lengths 256,512,1024,2048,4096,8192 --methods htp --long-budget 1024:4
r $Q --output results/h100 --data passkey --context-lengths 256,512,1024,2048,4096,8192 --methods vanilla-mean,tp-mean
r $Q --output results/h100 --data passkey --context-lengths 256,512,1024,2048,4096,8192 --methods htp --long-budget 1024:4
