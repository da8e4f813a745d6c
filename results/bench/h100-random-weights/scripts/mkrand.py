"""Random-weight copies of packaged models (their config and tokenizer), for timing only."""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, dst, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
for name in names:
    out = dst / name
    shutil.copytree(src / name, out, dirs_exist_ok=True)
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    print(name, sum(p.numel() for p in model.parameters()), "parameters, random weights")
