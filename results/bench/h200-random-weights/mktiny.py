"""A 2-layer random-weight copy of SmolLM2's architecture and tokenizer (forward passes as
short as on a GPU, for pool_batches.py); reads the random-weight copy mkrand.py wrote."""
import shutil

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src = "/tmp/randmodels/smollm2-135m-instruct"
out = "/tmp/tiny/smol-tiny"
shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors"))
cfg = AutoConfig.from_pretrained(out)
cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 2, 1, 32
torch.manual_seed(0)
AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
print("wrote", out)
