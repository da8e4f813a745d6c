#!/bin/bash
s=$1; L=256,512,1024,2048,4096,8192
r() { echo "[$(date +%T)] $*"; "$@" > /root/logs/run-seed$s-$(date +%s%N).txt 2>&1 && echo "  ok $(date +%T)" || echo "  FAILED rc=$?"; }
for D in needle passkey; do
  r htp-retrieval eval --quiet --output research/results/seeds-h100 --seed $s --data $D --context-lengths $L --methods vanilla-mean,htp
  r htp-retrieval eval --quiet --output research/results/seeds-h100 --seed $s --model qwen2.5-coder-0.5b-instruct --data $D --context-lengths $L --methods vanilla-mean,htp
done
