#!/bin/bash
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HTP_RETRIEVAL_CACHE=/tmp/htpcache PYTHONWARNINGS=ignore::SyntaxWarning
R=$PWD
log() { echo "[$(date +%T)] $*"; }
log start; nproc
mkdir -p /tmp/site /tmp/pay /tmp/pkg
[ -d /tmp/site/spacy ] || tar xJf .dev/site.tar.xz -C /tmp/site || exit 3
[ -d /tmp/pay/models ] || tar xJf .dev/payload.tar.xz -C /tmp/pay || exit 3
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/pkg . 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/pkg:/tmp/site
cd /tmp
m=smollm2-135m-instruct
[ -f /tmp/models/$m/model.safetensors ] || python3 $R/.dev/mkrand.py /tmp/pay/models /tmp/models $m || exit 5
log setup done
for L in 512 8192; do
  log "bench $L"
  timeout ${TL:-150} python3 -m htp_retrieval.cli bench --device cuda --data /tmp/pay/data/beir/scifact --no-memory --quiet --repeats 3 --threads 0 --lengths $L --n-docs 256 --long-docs 16 --output $OUT --model /tmp/models/$m --methods raw,vanilla-mean,vanilla-mean~p8,htp,htp~p8 2>&1 | grep -v "^truncated"
done
log end
