#!/bin/bash
# usage (device): bash .dev/gpu.sh 2>&1 | tee $OUT/log.txt
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HTP_RETRIEVAL_CACHE=/tmp/htpcache
R=$PWD
log() { echo "[$(date +%T)] $*"; }
log start
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader; nproc
lscpu | grep -E "Model name"
rm -rf /tmp/pkg; mkdir -p /tmp/site /tmp/pay /tmp/pkg
[ -d /tmp/site/spacy ] || tar xJf .dev/site.tar.xz -C /tmp/site || exit 3
[ -d /tmp/pay/models ] || tar xJf .dev/payload.tar.xz -C /tmp/pay || exit 3
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/pkg . 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/pkg:/tmp/site
cd /tmp
python3 -c "import htp_retrieval, torch, transformers, spacy, sentence_transformers as s; print(htp_retrieval.__file__, torch.__version__, transformers.__version__, spacy.__version__, s.__version__)" || exit 4
python3 -c "import logging; logging.basicConfig(level=logging.INFO); from htp_retrieval.dtypes import resolve_dtype; print('dtype auto on cuda:', resolve_dtype('auto', 'cuda'))"
for m in ${MODELS:-smollm2-135m-instruct qwen2.5-coder-0.5b-instruct}; do
  [ -f /tmp/models/$m/model.safetensors ] || python3 $R/.dev/mkrand.py /tmp/pay/models /tmp/models $m || exit 5
done
B="python3 -m htp_retrieval.cli bench --device cuda --data /tmp/pay/data/beir/scifact --no-memory --repeats 3 --threads 0 --lengths 512,8192 --n-docs 256 --long-docs 16 --output $OUT"
M=${METHODS:-raw,vanilla-mean,vanilla-mean~p4,vanilla-mean~p8,htp,htp~p4,htp~p8,st-mean}
bench() {
  log "bench $1"; timeout ${TL:-230} $B --model /tmp/models/$1 --methods $M 2>&1 | tee -a $OUT/raw.log | grep -v "^truncated" | tr "\r" "\n" | grep -v -E "^(encode|Batches|warm)|it/s\]$" 
  rc=${PIPESTATUS[0]}
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
    log "bench $1 failed (rc=$rc): again without st-mean"
    timeout ${TL:-230} $B --model /tmp/models/$1 --methods ${M/,st-mean/} 2>&1 | grep -v "^truncated"
  fi
}
for m in ${MODELS:-smollm2-135m-instruct qwen2.5-coder-0.5b-instruct}; do
  bench $m
  if [ $m = smollm2-135m-instruct ] && [ -z "${NOCHUNK:-}" ] && [ -f /tmp/pay/qmsum24.json ] && [ -f $R/.dev/chunk_time.py ]; then
    log "chunk timing"; timeout 120 python3 $R/.dev/chunk_time.py /tmp/models/$m /tmp/pay/qmsum24.json 2>&1 | grep -v "Loading weights"
  fi
done
if [ $SECONDS -lt ${EXTRA_BEFORE:-400} ]; then
  log "extra: 64 documents of 8192 tokens"
  timeout 150 python3 -m htp_retrieval.cli bench --device cuda --data /tmp/pay/data/beir/scifact --no-memory --quiet --repeats 3 --threads 0 --lengths 8192 --n-docs 256 --long-docs 64 --output $OUT/long64 --model /tmp/models/smollm2-135m-instruct --methods raw,vanilla-mean,vanilla-mean~p8,htp,htp~p8 2>&1 | grep -v "^truncated"
fi
log end
