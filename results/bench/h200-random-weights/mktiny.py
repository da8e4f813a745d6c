import shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
src="/tmp/randmodels/smollm2-135m-instruct"; out="/tmp/tiny/smol-tiny"
shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors"))
cfg=AutoConfig.from_pretrained(out); cfg.num_hidden_layers=2; cfg.hidden_size=64; cfg.intermediate_size=128; cfg.num_attention_heads=2; cfg.num_key_value_heads=1; cfg.head_dim=32
torch.manual_seed(0); m=AutoModelForCausalLM.from_config(cfg); m.save_pretrained(out); print("ok")
