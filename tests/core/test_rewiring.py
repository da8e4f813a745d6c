"""Hooks on tiny random Llama/Qwen2 decoders: where copies happen, and early exit."""

from __future__ import annotations

import torch

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.rewiring import CopyPlan, decoder_layers, run_decoder

TEXT = "The cell divides quickly. Its membrane breaks! Then proteins fold again. Done."


def _inputs(enc: HTPEncoder, texts: list[str]):  # noqa: ANN202
    layouts = enc.build_layouts(texts)
    width = max(len(x) for x in layouts)
    ids = torch.zeros((len(texts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, lay in enumerate(layouts):
        ids[r, : len(lay)] = torch.tensor(lay.input_ids)
        mask[r, : len(lay)] = 1
    emb = enc.model.get_input_embeddings()
    embeds = emb(ids.clamp(max=emb.weight.shape[0] - 1))
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return layouts, embeds, mask, pos


def test_copies_fire_only_in_tp_range(tiny) -> None:  # noqa: ANN001
    model, tok = tiny
    enc = HTPEncoder(model, "htp-last", tokenizer=tok, tp_start=2, tp_exit=4, output_layer=-1,
                     dtype="float32")
    layouts, embeds, mask, pos = _inputs(enc, [TEXT, "Short one. Two."])
    seen: dict[int, torch.Tensor] = {}
    layers = decoder_layers(model)
    handles = [
        layer.register_forward_hook(
            lambda m, args, out, i=i: seen.__setitem__(i, args[0].detach().clone()))
        for i, layer in enumerate(layers)
    ]
    try:
        plan = CopyPlan.from_layouts(layouts, [0, 0], "cpu")
        with torch.no_grad():
            run_decoder(model, inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                        exit_layer=len(layers), plan=plan, tp_start=2, tp_exit=4)
    finally:
        for h in handles:
            h.remove()
    assert len(layouts[0].pst_positions) == 4  # four sentences, K=1
    for i, h in seen.items():
        for r, lay in enumerate(layouts):
            local = [torch.equal(h[r, d], h[r, s]) for d, s in lay.local_copies]
            glob = [torch.equal(h[r, d], h[r, s]) for d, s in lay.global_copies]
            if 2 <= i < 4:
                assert all(local) and all(glob), f"layer {i}: copies missing"
            elif i == 0:
                # <PST> and <B-PST> share one input embedding, so only local copies show
                assert not any(local), f"layer {i}: copy outside range"
            else:
                assert not any(local) and not any(glob), f"layer {i}: copy outside range"


def test_early_exit_equals_hidden_states_of_full_run(tiny) -> None:  # noqa: ANN001
    model, tok = tiny
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32")
    _, embeds, mask, pos = _inputs(enc, [TEXT])
    with torch.no_grad():
        full = model.model(inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                           output_hidden_states=True, use_cache=False).hidden_states
        for exit_layer in (1, 3, 5, 6):
            got = run_decoder(model, inputs_embeds=embeds, attention_mask=mask,
                              position_ids=pos, exit_layer=exit_layer)
            torch.testing.assert_close(got, full[exit_layer])


def test_early_exit_with_copies_matches_full_run_and_skips_later_layers(tiny) -> None:  # noqa: ANN001
    model, tok = tiny
    enc = HTPEncoder(model, "htp", tokenizer=tok, tp_start=1, tp_exit=3, dtype="float32")
    layouts, embeds, mask, pos = _inputs(enc, [TEXT])
    plan = CopyPlan.from_layouts(layouts, [0], "cpu")
    layers = decoder_layers(model)
    outputs: dict[int, torch.Tensor] = {}
    hs = [layers[i].register_forward_hook(
        lambda m, a, o, i=i: outputs.__setitem__(i, (o[0] if isinstance(o, tuple) else o).clone()))
        for i in range(len(layers))]
    calls = []
    hs.append(model.lm_head.register_forward_hook(lambda *a: calls.append(1)))
    try:
        with torch.no_grad():
            run_decoder(model, inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                        exit_layer=len(layers), plan=plan, tp_start=1, tp_exit=3)
            full = dict(outputs)
            outputs.clear()
            early = run_decoder(model, inputs_embeds=embeds, attention_mask=mask,
                                position_ids=pos, exit_layer=4, plan=plan, tp_start=1, tp_exit=3)
    finally:
        for h in hs:
            h.remove()
    torch.testing.assert_close(early, full[3])  # hidden_states[4] = output of layer index 3
    assert sorted(outputs) == [0, 1, 2, 3], "layers after the exit layer ran"
    assert calls == [], "the LM head ran"
