"""Diagnosis of HTP on a given model: sink norms, state drift, and ablation runs.

The ``python -m research`` commands behind research/ANALYSIS.md (``norms | drift | ablate |
hubs | table | seeds | compare | paired | same-layouts | weights-dtype``), run from the
repository root:

* ``norms``: per layer, the hidden-state norm of the sink (position 0), the ``<B-PST>`` and
  ``<PST>`` tokens and the copy sources, as multiples of the median text-token norm. It
  shows the attention sink (position 0's norm an order of magnitude above the median).
* ``drift``: per layer, the cosine between each text token's hidden state under a method
  and under vanilla (same tokens, no placeholders), averaged over tokens: how far the
  rewiring moves the states that mean pooling reads.
* ``ablate``: named encoder variants (method, layers, exit, K, placeholder init, sink,
  document instruction) scored on a BEIR split, one results JSON per variant.
* ``hubs``: the same variants, asking why rank 1 falls on a few documents: how parallel
  the document embeddings are, which documents take rank 1 and how far they lie from the
  corpus mean, and the scores with each side centred (:mod:`research.hubs`).
* ``table``: the ablation table of a results folder, or one metric across seeds.
* ``seeds`` / ``compare``: one metric across generator seeds, or across two results trees.
* ``paired``: per-query paired differences (bootstrap interval, Wilcoxon) and scores split
  by needle position (:mod:`research.paired`).
* ``same-layouts``: whether other K-policy settings give a finished run the same inputs
  (:mod:`research.layout_check`).
* ``weights-dtype``: whether the cached bf16 weights change float32 embeddings
  (:mod:`research.weight_dtype`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np

from htp_retrieval.config import SETTING_KEYS
from htp_retrieval.eval.calibrate import FIXED_LENGTH
from htp_retrieval.eval.synthetic import parse_synthetic_spec
from htp_retrieval.layout import parse_long_budget
from htp_retrieval.models import DTypeName

ENCODER_KEYS = (set(SETTING_KEYS) - {"preset", "overflow"}) | {"dtype", "padding_side"}
"""Variant keys passed to the encoder: the HTPConfig settings, and dtype and padding side."""
RUN_KEYS = {"query_instruction", "document_instruction"}

# The ablation groups, each a list of ``name:key=value,...`` variant specs.
PRESETS: dict[str, list[str]] = {
    "sink": [
        "vanilla-mean:method=vanilla-mean",
        "htp:method=htp",
        "htp-bpst-at-0:method=htp,keep_sink=false",
        "htp-doc-instruction:method=htp,document_instruction=Represent this document for "
        "retrieval",
        "vanilla-doc-instruction:method=vanilla-mean,document_instruction=Represent this "
        "document for retrieval",
    ],
    "init": [
        "htp-init-mean:method=htp,placeholder_init=mean",
        "htp-init-zeros:method=htp,placeholder_init=zeros",
        "htp-init-period:method=htp,placeholder_init=token:.",
        "htp-init-bos:method=htp,placeholder_init=bos",
    ],
    "components": [
        "vanilla-mean:method=vanilla-mean",
        "htp-no-copies:method=htp,tp_start=0,tp_exit=0",
        "tp-sentence:method=tp-sentence",
        "htp:method=htp",
        "tp-mean:method=tp-mean",
    ],
    # HTP documents, queries embedded by a short-text method
    "pairing": [
        "htp:method=htp",
        "htp-docs-vanilla-queries:method=htp,query_method=vanilla-mean",
        "htp-docs-tp-queries:method=htp,query_method=tp-mean",
        "htp-docs-prompteol-queries:method=htp,query_method=prompteol-last",
        "htp-docs-tp-prompteol-queries:method=htp,query_method=tp-prompteol-last",
    ],
}


def parse_variant(spec: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Parse ``name:key=value,key=value`` into encoder and run keyword arguments.

    A key ``query_<setting>`` (for example ``query_method=tp-mean`` or ``query_tp_start=1``)
    sets an encoder setting for the queries only: the queries get an encoder of their own
    and the documents keep the variant's. Values ``none``/``true``/``false`` and integers are
    converted, ``long_budget`` and
    ``short_budget`` take
    ``L:B_L`` or ``0`` (:func:`htp_retrieval.layout.parse_long_budget`); anything else stays a
    string (commas inside a value are not supported except in instructions, which must
    come last).

    Returns:
        ``(name, encoder_kwargs, run_kwargs)``; query-only settings are in
        ``run_kwargs["query_settings"]``.

    Raises:
        ValueError: for a missing name or an unknown key (the message lists valid keys).
    """
    name, _, rest = spec.partition(":")
    if not name:
        raise ValueError(f"variant {spec!r} has no name (use name:key=value,...)")
    enc: dict[str, Any] = {}
    run: dict[str, Any] = {}
    items: list[str] = []
    for part in rest.split(",") if rest else []:
        if "=" in part or not items:
            items.append(part)
        else:  # a comma inside the previous value
            items[-1] += "," + part
    for item in items:
        key, _, raw = item.partition("=")
        key = key.strip()
        value: Any = raw
        low = raw.strip().lower()
        if key.removeprefix("query_") in ("long_budget", "short_budget"):  # L:B_L, or 0
            value = parse_long_budget(raw, name=key.replace("_", " ")) or 0
        elif low == "none":
            value = None
        elif low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                value = raw
        if key in ENCODER_KEYS:
            enc[key] = value
        elif key in RUN_KEYS:
            run[key] = value
        elif key.startswith("query_") and key.removeprefix("query_") in ENCODER_KEYS:
            run.setdefault("query_settings", {})[key.removeprefix("query_")] = value
        else:
            raise ValueError(
                f"variant {name!r}: unknown key {key!r}; valid: "
                + ", ".join(sorted(ENCODER_KEYS | RUN_KEYS)) + ", and query_<setting> for "
                "an encoder setting of the queries only"
            )
    return name, enc, run


def layer_states(encoder: Any, text: str, *, instruction: str | None = None) -> tuple[Any, Any]:
    """Hidden states after every layer up to the encoder's exit, for one text.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder`.
        text: The text.
        instruction: Optional instruction.

    Returns:
        ``(layout, states)``: the :class:`~htp_retrieval.layout.Layout` and a float32 tensor
        ``[n_layers_run, seq, hidden]`` (the output of each layer, copies included).
    """
    import torch

    from htp_retrieval.rewiring import decoder_layers

    layout = encoder.build_layouts([text], instruction=instruction)[0]
    captured: dict[int, torch.Tensor] = {}

    def hook(i: int):  # noqa: ANN202
        def f(_m: Any, _a: Any, out: Any) -> None:
            h = out[0] if isinstance(out, tuple) else out
            captured[i] = h[0].detach().float().cpu().clone()  # later hooks write in place
        return f

    handles = [layer.register_forward_hook(hook(i))
               for i, layer in enumerate(decoder_layers(encoder.model))]
    try:
        encoder._forward([layout])
    finally:
        for h in handles:
            h.remove()
    return layout, torch.stack([captured[i] for i in sorted(captured)])


def norm_profile(encoder: Any, texts: Sequence[str]) -> dict[str, list[float]]:
    """Per-layer hidden-state norms as multiples of the median text-token norm.

    Args:
        encoder: An encoder with a placeholder method (``htp`` shows all groups).
        texts: Texts (averaged over them).

    Returns:
        ``group -> [n_layers_run]`` ratios for ``sink`` (position 0), ``bpst``, ``pst``,
        ``copy_source`` (each block's last token) and ``text_max``.
    """
    groups: dict[str, list[np.ndarray]] = {}
    for text in texts:
        lay, st = layer_states(encoder, text)
        norms = st.norm(dim=-1).numpy()  # [layers, seq]
        med = np.median(norms[:, list(lay.pool_positions)], axis=1)
        parts = {"sink": [0], "bpst": list(lay.bpst_positions), "pst": list(lay.pst_positions),
                 "copy_source": [s for _, s in lay.local_copies],
                 "text_max": None}
        for g, pos in parts.items():
            if g == "text_max":
                v = norms[:, list(lay.pool_positions)].max(axis=1) / med
            elif pos:
                v = norms[:, pos].mean(axis=1) / med
            else:
                continue
            groups.setdefault(g, []).append(v)
    return {g: np.mean(v, axis=0).round(3).tolist() for g, v in groups.items()}


def drift_profile(encoder: Any, reference: Any, texts: Sequence[str]) -> list[float]:
    """Per-layer mean cosine between text-token states of ``encoder`` and ``reference``.

    Both encoders must share the model and keep the same text tokens (same max length);
    the text tokens are matched in order through each layout's ``pool_positions``.

    Returns:
        ``[n_layers_run]`` mean cosine similarities (1.0 = no drift).
    """
    import torch

    per_text = []
    for text in texts:
        la, sa = layer_states(encoder, text)
        lb, sb = layer_states(reference, text)
        a = sa[:, list(la.pool_positions)]
        b = sb[:, list(lb.pool_positions)]
        n = min(a.shape[0], b.shape[0])
        per_text.append(torch.nn.functional.cosine_similarity(a[:n], b[:n], dim=-1)
                        .mean(dim=1).numpy())
    n = min(len(p) for p in per_text)
    return np.mean([p[:n] for p in per_text], axis=0).round(4).tolist()


def _texts(args: argparse.Namespace) -> list[str]:
    from htp_retrieval.eval.data import load_beir

    data = load_beir(args.data, split=args.split)
    ids = sorted(data.corpus)[: args.n_texts]
    return [data.doc_text(d) for d in ids]


def _plot(series: dict[str, list[float]], path: Path, *, ylabel: str, title: str,
          log: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, ys in series.items():
        ax.plot(range(1, len(ys) + 1), ys, marker=".", label=name)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_norms(args: argparse.Namespace) -> int:
    from htp_retrieval.encoder import HTPEncoder

    enc = HTPEncoder(args.model, args.method, output_layer=-1, dtype=args.dtype, **FIXED_LENGTH)
    prof = norm_profile(enc, _texts(args))
    out = Path(args.output) / args.model.replace("/", "__")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"norms-{args.method}" + ("" if args.dtype == "bfloat16" else f"-{args.dtype}")
    (out / f"{stem}.json").write_text(json.dumps(
        {"model": args.model, "method": args.method, "config": enc.record(), "profile": prof,
         "command": _command()}, indent=2))
    _plot(prof, out / f"{stem}.png", ylabel="norm / median text-token norm", log=True,
          title=f"{args.model}: hidden-state norms ({args.method} layout, {args.dtype})")
    print("| layer | " + " | ".join(prof) + " |\n|---|" + "---|" * len(prof))
    for i in range(len(next(iter(prof.values())))):
        print(f"| {i + 1} | " + " | ".join(f"{prof[g][i]:.1f}" for g in prof) + " |")
    print(f"-> {out / stem}.json, .png", file=sys.stderr)
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from htp_retrieval.encoder import HTPEncoder

    ref = HTPEncoder(args.model, "vanilla-mean", output_layer=-1, **FIXED_LENGTH)
    texts = _texts(args)
    series = {}
    for m in args.methods.split(","):
        enc = HTPEncoder(args.model, m, output_layer=-1, **FIXED_LENGTH)
        series[m] = drift_profile(enc, ref, texts)
    out = Path(args.output) / args.model.replace("/", "__")
    out.mkdir(parents=True, exist_ok=True)
    (out / "drift.json").write_text(json.dumps({"model": args.model, "drift": series,
                                                "command": _command()}, indent=2))
    _plot(series, out / "drift.png", ylabel="cosine to vanilla (text tokens)",
          title=f"{args.model}: state drift from vanilla per layer")
    print("| layer | " + " | ".join(series) + " |\n|---|" + "---|" * len(series))
    for i in range(min(len(v) for v in series.values())):
        print(f"| {i + 1} | " + " | ".join(f"{series[m][i]:.3f}" for m in series) + " |")
    return 0


def _command() -> str:
    return "python -m research " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def ablation_table(rows: Sequence[tuple[str, Any]]) -> str:
    """Markdown table of ablation results, deltas against the first row.

    ``rank-1 docs``: distinct documents at rank 1 over the queries, and how many queries
    the most frequent one takes (``–`` for results saved before it was recorded).

    Args:
        rows: ``(variant name, RetrievalResult)`` pairs; the first is the baseline.
    """
    from htp_retrieval.eval.report import key_is_relevant

    lines: list[str] = []
    base = rows[0][1].scores["NDCG@10"]
    lines.append(f"| variant | NDCG@10 | Δ vs {rows[0][0]} | Recall@100 | rank-1 docs | method "
                 "| <PST> summary | copy layers | exit layer | extra settings |\n"
                 "|---|---|---|---|---|---|---|---|---|---|")
    for name, res in rows:
        c = res.config
        placeholders = key_is_relevant(c["method"], "tp_start")  # the method has copies
        summary = c["summary"] if key_is_relevant(c["method"], "summary") else "–"
        ran = {k: c.get(f"{k}_recorded", c.get(k)) for k in _EXTRA_OFF}  # as it ran
        extra = {k: v for k, v in ran.items() if v not in _EXTRA_OFF[k]}
        if c.get("document_instruction"):
            extra["document_instruction"] = "task instruction"
        if "query_config" in c:  # the query encoder's settings that differ from the documents'
            q = c["query_config"]
            extra.update({f"query_{k}": v for k, v in q.items()
                          if k in ENCODER_KEYS and v != c.get(k)})
        window = f"{c['tp_start']}-{c['tp_exit'] - 1}" if c["tp_exit"] > c["tp_start"] else "none"
        n = res.counts
        rank1 = (f"{n['rank1_docs']} (top {n['rank1_top_queries']} of {n['n_queries']})"
                 if "rank1_docs" in n else "–")
        lines.append(f"| {name} | {res.scores['NDCG@10']:.2f} | {res.scores['NDCG@10'] - base:+.2f} "
              f"| {res.scores['Recall@100']:.2f} | {rank1} | {c['method']} "
              f"| {summary} "
              f"| {window if placeholders else '–'} | {c['exit_layer']} of {c['n_layers']} "
              f"| {', '.join(f'{k}={v}' for k, v in extra.items()) or '–'} |")
    return "\n".join(lines)


def config_diff(stored: dict[str, Any], current: dict[str, Any]) -> str:
    """Encoder settings where a stored result's config differs from ``current``.

    Args:
        stored: ``config`` of a saved result (keys absent count as ``None`` on both sides,
            as :meth:`HTPEncoder.config` omits settings at their off value; its run keys,
            such as the instructions, are not compared).
        current: :meth:`HTPEncoder.config` of the encoder the variant builds now.

    Returns:
        ``"key: stored -> current, ..."``, empty when they agree.
    """
    keys = sorted(set(current) | (set(stored) & ENCODER_KEYS))
    diffs = [f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in keys
             if stored.get(k) != current.get(k)]
    return ", ".join(diffs)


def variant_specs(args: argparse.Namespace) -> list[str]:
    """The ``--variant`` specs followed by those of each ``--preset``.

    Raises:
        SystemExit: for an unknown preset or when neither flag is given.
    """
    specs = list(args.variant or [])
    for p in args.preset or []:
        if p not in PRESETS:
            raise SystemExit(f"unknown preset {p!r}; valid: {', '.join(PRESETS)}")
        specs.extend(PRESETS[p])
    if not specs:
        raise SystemExit("give --variant name:key=value,... or --preset")
    return specs


def corpus_checkpoint(out: Path, encoder: Any, document_instruction: str | None) -> Path:
    """Checkpoint folder of a variant's corpus embeddings under an ablation folder.

    Keyed by the document encoder's config and instruction, so variants that differ only
    on the query side (and ``hubs`` runs of an ``ablate`` variant) share one
    corpus encode.
    """
    key = json.dumps([encoder.record(), document_instruction], sort_keys=True)
    return out / "corpus.partial" / hashlib.sha256(key.encode()).hexdigest()[:16]


def ablation_data(args: argparse.Namespace) -> tuple[Any, tuple[str, int] | None, int | None, str]:
    """The data ``ablate`` and ``hubs`` score, from their shared flags.

    Args:
        args: Parsed flags: ``data`` (a BEIR folder, or ``needle:<tokens>`` /
            ``passkey:<tokens>``), ``split``, ``seed``, ``max_queries``, ``max_docs``,
            ``max_length``.

    Returns:
        ``(data, synthetic, max_length, tag)``: the (subsampled) dataset; ``(task, length)``
        for needle/passkey, else ``None``; the max text tokens (``None`` for needle/passkey,
        whose documents are encoded whole, measured per model); the results subfolder name.

    Raises:
        ValueError: from the loaders, for a missing folder or a malformed spec.
    """
    from htp_retrieval.eval.data import load_beir, subsample

    synthetic = parse_synthetic_spec(args.data)
    max_length = args.max_length
    if synthetic is not None:
        from htp_retrieval.eval.harness import resolve_data

        task, length = synthetic
        # exactly the data `eval --data <task> --context-lengths <length> --seed S` scores,
        # encoded as it encodes them (every document whole: set below, once measured)
        (item,) = resolve_data(task, seed=args.seed, context_lengths=[length],
                               max_queries=args.max_queries or 0, max_docs=args.max_docs or 0)
        data = item.data
        max_length = None
        tag = f"{task}-{length}-seed{args.seed}" + (
            f"-q{args.max_queries or 0}d{args.max_docs or 0}"
            if args.max_queries or args.max_docs else "")  # a subset: never the full set's folder
    else:
        if args.max_queries is None:
            args.max_queries = 100
        if args.max_docs is None:
            args.max_docs = 400
        data = load_beir(args.data, split=args.split)
        if args.max_queries or args.max_docs:
            data = subsample(data, n_queries=args.max_queries or None,
                             n_docs=args.max_docs or None, seed=args.seed)
        tag = f"{data.name}-{args.split}" + (
            f"-q{args.max_queries}d{args.max_docs}s{args.seed}"
            if args.max_queries or args.max_docs else "")
    return data, synthetic, max_length, tag


def cmd_ablate(args: argparse.Namespace) -> int:
    import torch

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.harness import SYNTHETIC_METRICS, encode_length
    from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval
    from htp_retrieval.eval.synthetic import synthetic_query_meta

    if args.threads:
        torch.set_num_threads(args.threads)
    specs = variant_specs(args)
    data, synthetic, max_length, tag = ablation_data(args)
    out = Path(args.output) / args.model.replace("/", "__") / tag
    rows = []
    seen: set[str] = set()
    for spec in specs:
        name, ekw, rkw = parse_variant(spec)
        if name in seen:
            continue
        seen.add(name)
        path = out / f"{name}.json"
        enc = HTPEncoder(args.model, **{**FIXED_LENGTH, **ekw})
        if "max_length" not in ekw:
            if max_length is None:  # needle/passkey, measured with this model's tokenizer
                max_length = encode_length(enc, data, context_length=synthetic[1])
            ekw["max_length"] = enc.max_length = max_length
        qsettings = rkw.pop("query_settings", {})
        if path.exists() and not args.overwrite:
            res = RetrievalResult.load(path)
            diff = config_diff(res.config, enc.record())
            if diff:
                raise SystemExit(
                    f"{path} holds variant {name!r} made with other encoder settings "
                    f"({diff}), e.g. under an earlier default; pass --overwrite to recompute "
                    "it with the current ones, or give the variant another name")
        else:
            qenc = (HTPEncoder(args.model, **{**FIXED_LENGTH, **ekw, **qsettings})
                    if qsettings else None)
            # Variants that differ only on the query side share one corpus encode: the
            # corpus is checkpointed under a key of the document encoder's config.
            corpus = corpus_checkpoint(out, enc, rkw.get("document_instruction"))
            res = run_retrieval(enc, data, split=args.split, show_progress_bar=not args.quiet,
                                query_encoder=qenc, checkpoint_dir=corpus,
                                chunk_size=args.chunk_size,
                                metrics=SYNTHETIC_METRICS if synthetic is not None else None, **rkw)
            if synthetic is not None:
                res.query_meta = synthetic_query_meta(data)
            res.config.update(variant=name, variant_spec=spec, command=_command())
            res.run = _ablation_run(enc, qenc, args, synthetic)
            res.label = name
            res.save(path)
        rows.append((name, res))
        print(f"[{name}] NDCG@10 {res.scores['NDCG@10']:.2f}", file=sys.stderr)
    print(ablation_table(rows))
    return 0


def _ablation_run(enc: Any, qenc: Any, args: argparse.Namespace,
                  synthetic: tuple[str, int] | None) -> dict[str, Any]:
    """The run identity of one ablation variant (:func:`htp_retrieval.eval.naming.run_identity`),
    as ``eval`` records it: model, dtype, padding side, resolved config, data settings."""
    from htp_retrieval.config import HTPConfig
    from htp_retrieval.eval.naming import data_settings, run_identity

    rec = enc.record()
    data = data_settings(max_queries=args.max_queries, max_docs=args.max_docs, seed=args.seed,
                         context_length=synthetic[1] if synthetic is not None else None)
    return run_identity(model=rec["model"], dtype=rec["dtype"],
                        padding_side=rec.get("padding_side", "right"),
                        config=HTPConfig.from_record(rec), data=data,
                        query_config=(HTPConfig.from_record(qenc.record())
                                      if qenc is not None else None))


@dataclass
class SeedRow:
    """One variant of :func:`seed_rows`: a metric across folders (seeds) and its difference
    to the baseline.

    Attributes:
        name: Variant name.
        scores: Folder label -> metric (percent), for the folders that have the variant.
        mean: Mean over those folders.
        delta: Mean over the folders that also have the baseline of ``variant - baseline``
            (points); NaN if there are none.
        ci: 95% interval of ``delta`` with the queries resampled within each folder
            (:func:`~research.paired.seeds_ci`); ``None`` for the baseline, and
            unless every such folder has per-query rows for both on the same queries.
        ahead: Folders where the variant is at or above the baseline.
        n_both: Folders that have both.
    """

    name: str
    scores: dict[str, float]
    mean: float
    delta: float
    ci: tuple[float, float] | None
    ahead: int
    n_both: int


def seed_rows(folders: Sequence[tuple[str, Sequence[tuple[str, Any]]]], *,
              baseline: str = "vanilla-mean", metric: str = "NDCG@10") -> list[SeedRow]:
    """One metric per variant across several result folders (seeds), against a baseline.

    Args:
        folders: ``(folder label, [(variant name, RetrievalResult), ...])`` per folder, e.g.
            one folder per generation seed of ``ablate --data passkey:256``.
        baseline: Variant the differences compare with.
        metric: Score key (``NDCG@10``, ``Acc@1``, ...).

    Returns:
        A :class:`SeedRow` per variant, the baseline first, the others in first-seen order.

    Raises:
        ValueError: if no folder has the baseline variant.
    """
    names: list[str] = []
    results: dict[str, dict[str, Any]] = {}
    for label, rows in folders:
        for name, res in rows:
            if name not in results:
                names.append(name)
                results[name] = {}
            results[name][label] = res
    if baseline not in results:
        raise ValueError(f"no folder has the baseline variant {baseline!r}; "
                         f"variants: {', '.join(names)}")
    labels = [label for label, _ in folders]
    base = {lab: float(r.scores[metric]) for lab, r in results[baseline].items()}
    names.sort(key=lambda n: n != baseline)
    out = []
    for name in names:
        sc = {lab: float(results[name][lab].scores[metric]) for lab in labels
              if lab in results[name]}
        both = [lab for lab in labels if lab in sc and lab in base]
        out.append(SeedRow(
            name=name, scores=sc, mean=float(np.mean(list(sc.values()))),
            delta=float(np.mean([sc[lab] - base[lab] for lab in both])) if both
            else float("nan"),
            ci=None if name == baseline else _seeds_ci(
                [(results[baseline][lab], results[name][lab]) for lab in both], metric),
            ahead=sum(sc[lab] >= base[lab] for lab in both), n_both=len(both)))
    return out


def seed_table(folders: Sequence[tuple[str, Sequence[tuple[str, Any]]]], *,
               baseline: str = "vanilla-mean", metric: str = "NDCG@10") -> str:
    """Markdown table of :func:`seed_rows`.

    Args:
        folders: As :func:`seed_rows`.
        baseline: Variant the ``Δ mean``, ``95% CI`` and ``at or above`` columns compare
            with.
        metric: Score key (``NDCG@10``, ``Acc@1``, ...).

    Returns:
        One row per variant: the metric per folder (``–`` where the folder lacks the
        variant), the mean over the folders that have it, its difference to the baseline's
        mean over the same folders, the 95% interval of that difference (``–`` where
        :attr:`SeedRow.ci` is ``None``), and in how many of them the variant is at or
        above the baseline.

    Raises:
        ValueError: if no folder has the baseline variant.
    """
    rows = seed_rows(folders, baseline=baseline, metric=metric)
    labels = [label for label, _ in folders]
    head = (f"| variant | {' | '.join(labels)} | mean | Δ mean vs {baseline} "
            f"| 95% CI | at or above {baseline} |")
    lines = [head, "|" + "---|" * (len(labels) + 5)]
    for r in rows:
        cells = " | ".join(f"{r.scores[lab]:.2f}" if lab in r.scores else "–"
                           for lab in labels)
        ci = "–" if r.ci is None else f"[{r.ci[0]:+.2f}, {r.ci[1]:+.2f}]"
        lines.append(f"| {r.name} | {cells} | {r.mean:.2f} | {r.delta:+.2f} | {ci} "
                     f"| {r.ahead} of {r.n_both} |")
    return "\n".join(lines)


def _seeds_ci(pairs: Sequence[tuple[Any, Any]], metric: str) -> tuple[float, float] | None:
    """:func:`~research.paired.seeds_ci`'s interval over ``(baseline, variant)``
    results per seed, or ``None`` where there are none, a pair lacks per-query rows, or
    their queries differ."""
    from research.paired import paired_columns, seeds_ci

    diffs = []
    for b, v in pairs:
        if not getattr(b, "per_query", None) or not getattr(v, "per_query", None):
            return None
        try:
            base, var = paired_columns(b, v, metric=metric)
        except ValueError:  # other queries, or no such metric
            return None
        diffs.append(var - base)
    if not diffs:
        return None
    _, lo, hi = seeds_ci(diffs)
    return lo, hi


_EXTRA_OFF: dict[str, tuple[Any, ...]] = {
    "keep_sink": (None, True), "max_blocks": (None,), "min_block_tokens": (None,),
    "long_budget": (None,), "short_budget": (None,), "bare_prefix": (None, ""), "k": (None, 1),
    "placeholder_init": (None, "mean")}
"""Settings the ablation table's ``extra settings`` column shows, and the values it leaves
out (off, or the method's default)."""
_SEED_OR_CTX = re.compile(r"__(?:seed|ctx)\d+")


SeedGroups = dict[tuple[str, str, int | None], list[tuple[str, list[tuple[str, Any]]]]]
"""``(model, dataset, context length) -> [(\"seed S\", [(variant, record), ...]), ...]``."""


def seed_groups(paths: Sequence[str | Path]) -> SeedGroups:
    """Needle/passkey results generated with different ``--seed`` values, grouped by model,
    dataset and context length, one folder entry per seed.

    Args:
        paths: Results JSONs or folders of them (not searched recursively), e.g.
            ``results/h100/<model>/needle-test research/results/seeds-h100/<model>/needle-test``.

    Returns:
        :data:`SeedGroups`, sorted by model, dataset and length, seeds ascending; a
        variant is the result's label without ``__ctxN``/``__seedN`` (the method and the
        settings given explicitly, e.g. ``htp__mb8``), except that a run with its method's
        shipped settings for its model (:func:`~htp_retrieval.eval.report.is_shipped`) is
        ``<method> (shipped)`` at every length when its label names a setting or its
        method has a density cap (``htp``).

    Raises:
        ValueError: if a path is missing or holds no results JSON, if a result has no
            generator seed (not a needle/passkey run; the message names the file), or if
            two files give the same variant, seed and length.
    """
    from htp_retrieval.eval.report import is_shipped, read_result
    from htp_retrieval.methods import METHODS

    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"no such results file or folder: {p}")
        found = sorted(p.glob("*.json")) if p.is_dir() else [p]
        if not found:
            raise ValueError(f"no results JSON in {p}")
        files.extend(found)
    records = {f: read_result(f) for f in files}
    # in each folder by label, as the variants read (file names are digests)
    files.sort(key=lambda f: (str(f.parent), (records[f].label or f.stem) + "__"))
    groups: dict[tuple[str, str, int | None], dict[int, list[tuple[str, Any]]]] = {}
    seen: dict[tuple[str, str, int | None, int, str], Path] = {}
    for f in files:
        rec = records[f]
        synthetic = rec.config.get("synthetic")
        if not isinstance(synthetic, dict) or "seed" not in synthetic:
            raise ValueError(f"{f}: no generator seed in its config (not a needle/passkey "
                             "result)")
        seed, variant = int(synthetic["seed"]), _SEED_OR_CTX.sub("", rec.label or f.stem)
        capped = getattr(METHODS.get(rec.method), "min_block_tokens", None) is not None
        if is_shipped(rec, ()) and (variant != rec.method or capped):
            variant = f"{rec.method} (shipped)"  # one name at every length
        key = (rec.model, rec.dataset, rec.length)
        if (*key, seed, variant) in seen:
            raise ValueError(f"{f} and {seen[(*key, seed, variant)]} are both {variant} "
                             f"at seed {seed}")
        seen[(*key, seed, variant)] = f
        groups.setdefault(key, {}).setdefault(seed, []).append((variant, rec))
    return {key: [(f"seed {s}", by_seed[s]) for s in sorted(by_seed)]
            for key, by_seed in sorted(groups.items(),
                                       key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0))}


def seed_tables(paths: Sequence[str | Path], *, baseline: str = "vanilla-mean",
                metric: str = "NDCG@10") -> str:
    """:func:`seed_table` per model, dataset and context length (:func:`seed_groups`).

    Args:
        paths: As :func:`seed_groups`.
        baseline: Variant the ``Δ mean`` column compares with: a file stem without its
            ``__ctxN`` and ``__seedN`` parts (e.g. ``vanilla-mean``), or ``htp (shipped)``.
        metric: Score key (``NDCG@10``, ``Acc@1``, ...).

    Returns:
        Markdown: a heading and a table per (model, dataset, context length), one column
        per seed, a row per variant.

    Raises:
        ValueError: as :func:`seed_groups`, or if a group lacks the baseline.
    """
    out = []
    for (model, dataset, length), folders in seed_groups(paths).items():
        out += [f"### {model} / {dataset}, context length {length} tokens ({metric})", "",
                seed_table(folders, baseline=baseline, metric=metric), ""]
    return "\n".join(out)


def plot_seed_deltas(paths: Sequence[str | Path], path: str | Path, *,
                     baseline: str = "vanilla-mean", metric: str = "NDCG@10") -> Path:
    """Plot :func:`seed_rows` against context length: one panel per model and dataset, the
    ``Δ mean`` of every variant run at two or more lengths with its 95% interval as an
    error bar, and a line at zero.

    Args:
        paths: As :func:`seed_groups`.
        path: PNG to write (parents created).
        baseline: Variant the differences compare with.
        metric: Score key.

    Returns:
        ``path``.

    Raises:
        ValueError: as :func:`seed_groups`, or if a group lacks the baseline.
        ImportError: if matplotlib is missing (the message says what to install).
    """
    from htp_retrieval.eval.report import _log2_axis, _pyplot_free_figure, _save

    panels: dict[tuple[str, str], dict[str, list[tuple[int, SeedRow]]]] = {}
    for (model, dataset, length), folders in seed_groups(paths).items():
        if length is None:
            continue
        lines = panels.setdefault((model, dataset), {})
        for row in seed_rows(folders, baseline=baseline, metric=metric):
            if row.name != baseline and row.n_both:
                lines.setdefault(row.name, []).append((length, row))
    for key in list(panels):  # a variant run at one length only is left to the table
        panels[key] = {n: pts for n, pts in panels[key].items() if len(pts) > 1}
        if not panels[key]:
            del panels[key]
    if not panels:
        raise ValueError("nothing to plot: no variant shares a seed with the baseline at "
                         "two or more context lengths")
    fig, axes = _pyplot_free_figure((5.5 * min(len(panels), 2), 3.6 * ((len(panels) + 1) // 2)),
                                    (len(panels) + 1) // 2, min(len(panels), 2))
    for ax, ((model, dataset), lines) in zip(axes, panels.items(), strict=False):
        xs_all: set[int] = set()
        for i, (name, pts) in enumerate(lines.items()):
            xs = np.array([x for x, _ in pts], dtype=float) * 1.04 ** i  # side by side
            ys = np.array([r.delta for _, r in pts])
            err = np.array([[r.delta - r.ci[0], r.ci[1] - r.delta] if r.ci else [0.0, 0.0]
                            for _, r in pts]).T
            ns = sorted({r.n_both for _, r in pts})
            seeds = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3,
                        label=f"{name} ({seeds} seed{'s' if ns[-1] > 1 else ''})")
            xs_all.update(x for x, _ in pts)
        ax.axhline(0.0, color="grey", lw=0.8)
        _log2_axis(ax, sorted(xs_all))
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(f"Δ {metric} vs {baseline}, mean over seeds")
        ax.set_title(f"{model} / {dataset}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _save(fig, Path(path))


def compare_roots(root_a: str | Path, root_b: str | Path, *, metric: str = "NDCG@10"
                  ) -> str:
    """The same runs in two results trees (another device, dtype or version), side by side.

    Every JSON under ``root_b`` whose relative path also exists under ``root_a`` (the same
    run: file names are digests of it) is one row, named by its folder, label and context
    length: the two scores and their difference. Used for CPU against H100 runs of the same
    commands (research/ANALYSIS.md, section 15).

    Args:
        root_a: Results tree read as the reference, e.g. ``results``.
        root_b: Results tree of the re-runs, e.g. ``results/h100``.
        metric: Score key (``NDCG@10``, ``Acc@1``, ...).

    Returns:
        A Markdown table (``run | a | b | b - a``) and a line with the mean and largest
        absolute difference.

    Raises:
        ValueError: if no file of ``root_b`` has a counterpart in ``root_a``.
    """
    from htp_retrieval.eval.report import read_result

    a, b = Path(root_a), Path(root_b)
    rows = []
    for fb in sorted(b.rglob("*.json")):
        fa = a / fb.relative_to(b)
        if not fa.is_file():
            continue
        ra, rb = read_result(fa), read_result(fb)
        sa, sb = ra.scores.get(metric), rb.scores.get(metric)
        if sa is None or sb is None:
            continue
        ctx = rb.config.get("context_length")
        name = f"{fb.relative_to(b).parent}/{rb.label or fb.stem}" + (f" ctx{ctx}" if ctx else "")
        rows.append((name, float(sa), float(sb)))
    rows.sort()
    if not rows:
        raise ValueError(f"no results JSON under {b} has a counterpart under {a}")
    lines = [f"| run | {a} | {b} | difference |", "|---|---|---|---|"]
    lines += [f"| {r} | {sa:.2f} | {sb:.2f} | {sb - sa:+.2f} |" for r, sa, sb in rows]
    diffs = [abs(sb - sa) for _, sa, sb in rows]
    lines += ["", f"{len(rows)} runs in both: mean absolute difference {np.mean(diffs):.2f}, "
              f"largest {max(diffs):.2f} ({metric})."]
    return "\n".join(lines)


def _cmd_hubs(args: argparse.Namespace) -> int:
    from research.hubs import cmd_hubs

    return cmd_hubs(args)


def cmd_table(args: argparse.Namespace) -> int:
    from htp_retrieval.eval.retrieval import RetrievalResult

    folders = []
    for f in args.folder:
        folder = Path(f)
        results = [(p.stem, RetrievalResult.load(p)) for p in sorted(folder.glob("*.json"))]
        if not results:
            raise SystemExit(f"no results JSON in {folder}")
        results.sort(key=lambda r: (r[0] != args.baseline, r[1].created))
        folders.append((folder.name, results))
    if len(folders) == 1:
        print(ablation_table(folders[0][1]))
        return 0
    try:
        print(seed_table(folders, baseline=args.baseline, metric=args.metric))
    except ValueError as e:
        raise SystemExit(f"python -m research table: {e}") from e
    return 0


def _print_or_exit(name: str, table: Any, *args: Any, **kwargs: Any) -> int:
    """Print ``table(*args, **kwargs)``; a ValueError exits with ``python -m research
    NAME: message`` (bad input named, no traceback)."""
    try:
        print(table(*args, **kwargs))
    except ValueError as e:
        raise SystemExit(f"python -m research {name}: {e}") from e
    return 0


def cmd_seeds(args: argparse.Namespace) -> int:
    rc = _print_or_exit("seeds", seed_tables, args.results, baseline=args.baseline,
                        metric=args.metric)
    if args.plot:
        try:
            out = plot_seed_deltas(args.results, args.plot, baseline=args.baseline,
                                   metric=args.metric)
        except ValueError as e:
            raise SystemExit(f"python -m research seeds --plot: {e}") from e
        print(f"plot: {out}", file=sys.stderr)
    return rc


def cmd_compare(args: argparse.Namespace) -> int:
    return _print_or_exit("compare", compare_roots, args.root_a, args.root_b,
                          metric=args.metric)


def add_subcommands(asub: argparse._SubParsersAction) -> None:
    """Register ``norms, drift, ablate, hubs, table, seeds, compare, paired, center, same-layouts,
    weights-dtype`` on
    the ``python -m research`` subparsers."""

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--model", default="smollm2-135m-instruct")
        q.add_argument("--data", default="../shared/data/beir/scifact")
        q.add_argument("--split", default="train")
        q.add_argument("--output", default="research/results/analysis")

    q = asub.add_parser("norms", help="per-layer norms of sink, placeholders, sources")
    common(q)
    q.add_argument("--n-texts", type=int, default=16)
    q.add_argument("--method", default="htp", help="a method with <PST>/<B-PST> placeholders")
    q.add_argument("--dtype", default="bfloat16", choices=get_args(DTypeName),
                   help="weights and activations (bf16 and fp32 differ on Qwen2.5: "
                   "research/ANALYSIS.md section 15.4); not bf16 adds -DTYPE to the file names")
    q.set_defaults(func=cmd_norms)

    q = asub.add_parser("drift", help="per-layer cosine of text-token states to vanilla")
    common(q)
    q.add_argument("--n-texts", type=int, default=16)
    q.add_argument("--methods", default="tp-mean,tp-sentence,htp-last,htp")
    q.set_defaults(func=cmd_drift)

    def variants(q: argparse.ArgumentParser) -> None:  # the flags ablate and hubs share
        common(q)
        q.add_argument("--variant", action="append",
                       help="name:key=value,... (keys: "
                       + ", ".join(sorted(ENCODER_KEYS | RUN_KEYS)) + ")")
        q.add_argument("--preset", action="append", help="variant group: " + ", ".join(PRESETS))
        q.add_argument("--max-queries", type=int, default=None,
                       help="BEIR: subsample queries (default 100, 0: all); needle/passkey: "
                       "queries (default 50)")
        q.add_argument("--max-docs", type=int, default=None,
                       help="BEIR: relevant documents + distractors (default 400, 0: all); "
                       "needle/passkey: candidate documents (default 100)")
        q.add_argument("--max-length", type=int, default=512,
                       help="max text tokens (BEIR data; needle/passkey documents are encoded "
                       "whole, as `eval` encodes them)")
        q.add_argument("--seed", type=int, default=0,
                       help="subsampling seed; needle/passkey: generation seed")
        q.add_argument("--threads", type=int, default=0)
        q.add_argument("--chunk-size", type=int, default=1024,
                       help="documents per corpus checkpoint chunk (an interrupted run resumes "
                       "from the finished chunks)")
        q.add_argument("--quiet", action="store_true")

    q = asub.add_parser("ablate", help="score named encoder variants on a BEIR split, or on "
                        "needle/passkey generated at one length (--data passkey:256)")
    variants(q)
    q.add_argument("--overwrite", action="store_true")
    q.set_defaults(func=cmd_ablate)

    q = asub.add_parser("hubs", help="hub documents: how parallel the embeddings are, which "
                        "documents take rank 1 and why, scores with each side centred "
                        "(same data and variants as ablate; reuses its corpus embeddings)")
    variants(q)
    q.set_defaults(func=_cmd_hubs)

    q = asub.add_parser("table", help="print the ablation table of a results folder, or one "
                        "metric across several folders (seeds) with means and a 95%% interval of "
                        "the difference to the baseline (queries resampled within each folder)")
    q.add_argument("folder", nargs="+",
                   help="e.g. research/results/analysis/<model>/scifact-train-q300d500s0; "
                   "several: research/results/analysis/<model>/passkey-256-seed{0,1,2}")
    q.add_argument("--baseline", default="vanilla-mean", help="first row (deltas against it)")
    q.add_argument("--metric", default="NDCG@10", help="score across folders (several folders)")
    q.set_defaults(func=cmd_table)

    q = asub.add_parser("seeds", help="needle/passkey results of several --seed values: "
                        "one table per model, dataset and context length, with means and a "
                        "95%% interval of the difference to the baseline")
    q.add_argument("results", nargs="+",
                   help="results JSONs or folders, e.g. "
                   "research/results/seeds-h100/<model>/needle-test")
    q.add_argument("--baseline", default="vanilla-mean",
                   help="variant the deltas compare with: a file stem without __ctxN/__seedN, "
                   "or '<method> (shipped)' for a run with its method's shipped settings")
    q.add_argument("--metric", default="NDCG@10")
    q.add_argument("--plot", metavar="PNG",
                   help="also plot each variant's Δ mean with its 95%% interval against "
                   "context length, a panel per model and dataset")
    q.set_defaults(func=cmd_seeds)

    q = asub.add_parser("compare", help="the same runs in two results trees (e.g. CPU and "
                        "GPU), side by side")
    q.add_argument("root_a", help="reference tree, e.g. results")
    q.add_argument("root_b", help="tree of re-runs, e.g. results/h100")
    q.add_argument("--metric", default="NDCG@10")
    q.set_defaults(func=cmd_compare)

    from research.centering import add_parser as add_center
    from research.layout_check import add_parser as add_same_layouts
    from research.paired import add_parser as add_paired
    from research.weight_dtype import add_parser as add_weights_dtype

    add_paired(asub)
    add_center(asub)
    add_same_layouts(asub)
    add_weights_dtype(asub)
