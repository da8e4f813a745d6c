#!/bin/bash
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HTP_RETRIEVAL_CACHE=/root/htpcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
m=$1; F=/root/stage/full
[ $m = smol ] && name=smollm2-135m-instruct || name=qwen2.5-coder-0.5b-instruct
set -e
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$F/$m.gguf.xz'), open('$F/$m.gguf','wb'), 16<<20)"
python3 -c "
from pathlib import Path; from htp_retrieval.models import _convert_gguf, cache_dir
_convert_gguf(Path('$F/$m.gguf'), cache_dir()/'models'/'$name')"
tar xJf $F/tok.tar.xz -C /root/htpcache/models $name
python3 /root/bin/manifest.py check $F/manifest.json $name /root/htpcache/models/$name/model.safetensors
echo "weights verified; starting job-$m"
cd /root/repo && bash /root/bin/job-$m.sh
echo "job-$m finished $(date +%T)"
