#!/bin/bash
# One device call: take this call's carried pieces, assemble, install, start jobs, report.
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HTP_RETRIEVAL_CACHE=/root/htpcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ST=/root/stage; mkdir -p $ST/full /root/logs /root/bin
cp .dev/bin/* /root/bin/
for d in .dev/c[0-9]*; do [ -d "$d" ] && cp -n "$d"/* $ST/ 2>/dev/null; done
python3 - <<'PY'
import json, os
parts = json.load(open("/root/bin/parts.json"))
for dst, ps in parts.items():
    out = f"/root/stage/full/{dst}"
    if os.path.exists(out) or not all(os.path.exists(f"/root/stage/{p}") for p in ps):
        continue
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "wb") as w:
        for p in ps:
            w.write(open(f"/root/stage/{p}", "rb").read())
    os.replace(out + ".tmp", out); print("assembled", dst, os.path.getsize(out))
missing = sorted({d for d, ps in parts.items() if not os.path.exists(f"/root/stage/full/{d}")})
print("still missing:", missing)
PY
F=$ST/full
if [ ! -e /tmp/site/.done ] && [ -e $F/pkg ] && python3 -c "
import json,os,sys; p=json.load(open('/root/bin/parts.json'))
sys.exit(0 if all(os.path.exists('/root/stage/full/'+d) for d in p if d.startswith(('whl/','pkg/'))) else 1)"; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $F/whl/*.whl $F/pkg/*.whl && touch /tmp/site/.done
  python3 -c "import transformers, torch, spacy, pytrec_eval, htp_retrieval.eval.harness as h; print('imports ok', transformers.__version__, torch.__version__, torch.cuda.get_device_name(0), h.__file__)"
fi
if [ -e $F/data.tar.xz ] && [ ! -e /root/shared/data/.done ]; then
  mkdir -p /root/shared/data && tar xJf $F/data.tar.xz -C /root/shared/data && touch /root/shared/data/.done && echo data ok
fi
if [ ! -e /root/repo/.done ]; then
  mkdir -p /root/repo && tar cf - --exclude=./.dev --exclude=./.whl --exclude=./.git . | (cd /root/repo && tar xf -) && touch /root/repo/.done && echo repo copied
fi
for m in smol qwen; do
  if [ -e $F/$m.gguf.xz ] && [ -e /tmp/site/.done ] && [ -e $F/tok.tar.xz ] && [ ! -e /root/logs/model-$m.started ]; then
    touch /root/logs/model-$m.started
    setsid nohup bash /root/bin/model.sh $m > /root/logs/model-$m.log 2>&1 < /dev/null &
    echo started model.sh $m
  fi
done
if [ "$1" = collect ]; then
  cd /root/repo && tar cJf $OUT/res.tar.xz results/h100 research/results/analysis-h100 results/bench/*h100* research/results/seeds-h100 results/fp32-h100 /root/logs 2>/dev/null; ls -la $OUT
fi
echo "--- status $(date +%T)"; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
for f in /root/logs/*.log; do echo "== $f"; tail -n 4 $f | cut -c1-300; done
ls /root/repo/results/h100/*/* /root/repo/research/results/analysis-h100/*/* 2>/dev/null | grep json | wc -l
