#!/bin/bash
L=256,512,1024,2048,4096,8192
O="--quiet --output results/fp32-h100 --dtype float32"
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-fp32-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
r htp-retrieval eval $O --model qwen2.5-coder-0.5b-instruct --data needle --context-lengths $L --methods vanilla-mean,htp
r htp-retrieval eval $O --model qwen2.5-coder-0.5b-instruct --data ../shared/data/longembed/qmsum --max-length 8192 --methods vanilla-mean,htp
r htp-retrieval eval $O --data needle --context-lengths $L --methods vanilla-mean,htp
r htp-retrieval eval $O --model qwen2.5-coder-0.5b-instruct --data passkey --context-lengths $L --methods vanilla-mean,htp
r htp-retrieval eval $O --data passkey --context-lengths $L --methods vanilla-mean,htp
