"""Command line: ``htp-retrieval eval | report | bench | calibrate | ingest | query | ...``.

The research commands (norms, drift, ablations, seeds, ...) are ``python -m research``, run
from the repository root (research/README.md).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any, get_args

from htp_retrieval.dtypes import DTypeArg
from htp_retrieval.methods import METHODS
from htp_retrieval.models import LAYER_PRESETS


def cmd_eval(args: argparse.Namespace) -> int:
    """``htp-retrieval eval``: datasets x methods x sweeps, one results JSON each."""
    import torch

    from htp_retrieval.chunking import check_chunk_settings
    from htp_retrieval.eval.chunk_eval import CHUNK_VARIANTS
    from htp_retrieval.eval.harness import (
        EvalSettings,
        format_results,
        parse_list,
        resolve_data,
        run_eval,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        max_lengths = parse_list(args.max_length)
        ks = parse_list(args.k) or [None]
        ns = parse_list(args.tokens_per_block, allow_auto=True) or [None]
        context_lengths = parse_list(args.context_lengths)
    except ValueError as e:
        raise SystemExit(f"htp-retrieval eval: {e}") from e
    chunk_size, chunk_chars = _checkpoint_limits(args)
    config = _config_file(args.config, "eval") if args.config else None
    if args.methods is None:
        args.methods = config.method if config is not None else "vanilla-mean,htp"
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    chunkings = [c.strip() for c in args.chunking.split(",") if c.strip()]
    bad = [c for c in chunkings if c not in CHUNK_VARIANTS]
    if bad or not chunkings:
        raise SystemExit(f"htp-retrieval eval: --chunking {args.chunking!r}: use a comma list "
                         f"of {', '.join(CHUNK_VARIANTS)}")
    try:
        check_chunk_settings(args.chunk_tokens, args.chunk_overlap)
    except ValueError as e:
        raise SystemExit(f"htp-retrieval eval: {e}") from e
    try:
        items = resolve_data(
            args.data, split=args.split, seed=args.seed, context_lengths=context_lengths,
            max_queries=args.max_queries, max_docs=args.max_docs,
            synthetic_tokenizer=args.synthetic_tokenizer, haystack=args.haystack)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise SystemExit(f"htp-retrieval eval: {e}") from e
    chunk_flags = (args.chunking != "naive" or args.chunk_tokens != 256 or args.chunk_overlap
                   or args.late_window is not None)
    if chunk_flags and not any(it.kind == "spans" for it in items):
        raise SystemExit(f"htp-retrieval eval: --chunking/--chunk-tokens/--chunk-overlap/"
                         f"--late-window apply to evidence-span data (spans/{args.split}.jsonl) "
                         f"only; --data {args.data!r} has none")
    given = [f for f, v in (("--chunk-size", args.chunk_size), ("--chunk-chars", args.chunk_chars))
             if v is not None]
    if given and not any(it.kind == "retrieval" for it in items):
        print(f"htp-retrieval eval: {'/'.join(given)} not used: they cut a retrieval corpus "
              f"into checkpoints and --data {args.data!r} has none (chunk-level evals "
              f"checkpoint every 8 documents, STS-B does not checkpoint)", file=sys.stderr)
    for it in items:
        size = (f"{len(it.data)} pairs" if it.kind == "sts" else
                f"{len(it.data.corpus)} documents, {len(it.data.queries)} queries")
        ctx = f", context length {it.context_length}" if it.context_length else ""
        print(f"{it.name} ({it.split}{ctx}): {size}, model {args.model}", file=sys.stderr)
    settings = EvalSettings(
        model=args.model, methods=methods, max_lengths=max_lengths, ks=ks, ns=ns,
        tp_start=args.tp_start, tp_exit=args.tp_exit, output_layer=args.output_layer,
        segmenter=args.segmenter, max_blocks=args.max_blocks,
        min_block_tokens=args.min_block_tokens, long_budget=args.long_budget,
        short_budget=args.short_budget, device=args.device, dtype=args.dtype,
        padding_side=args.padding_side, batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch, output=args.output,
        overwrite=args.overwrite, command=_command(args), show_progress_bar=not args.quiet,
        chunk_size=chunk_size, chunk_chars=chunk_chars,
        max_queries=args.max_queries, max_docs=args.max_docs,
        seed=args.seed, synthetic_tokenizer=args.synthetic_tokenizer, verbose=args.verbose,
        preset=_preset_arg(args, "eval"), chunkings=chunkings,
        chunk_tokens=args.chunk_tokens, chunk_overlap=args.chunk_overlap,
        late_window=args.late_window, config=config, center_queries=args.center_queries)
    if args.center_queries:
        from htp_retrieval.eval.centred import check_sample, evaluated_texts, read_query_sample

        try:
            sample, _ = read_query_sample(args.center_queries)
            for it in items:
                check_sample(sample, evaluated_texts(it.data), spec=args.center_queries,
                             split=f"{it.name} {it.split}")
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"htp-retrieval eval: --center-queries: {e}") from e
    if config is not None:
        from htp_retrieval.eval.harness import check_config_settings

        try:
            check_config_settings(settings)
        except ValueError as e:
            raise SystemExit(f"htp-retrieval eval: --config {args.config}: {e}") from e
    _check_model_arg(args.model, "eval")  # after every argument check, before any loading
    print(format_results(run_eval(items, settings)))
    return 0


def _check_model_arg(model: str, cmd: str) -> None:
    """Exit with one line naming ``--model`` and the fix when it cannot be loaded from here
    (a packaged model whose package is missing, no such folder or ``.gguf`` file, a hub id
    that is neither cached nor reachable), before any data is read or model loaded."""
    from htp_retrieval.integrations._runtime import check_model

    try:
        check_model(model)
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"htp-retrieval {cmd}: --model: {e}") from e


def _command(args: argparse.Namespace) -> str:
    """The command line that produced a result (``config["command"]``)."""
    argv = getattr(args, "argv", None)
    return "htp-retrieval " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))


def _checkpoint_limits(args: argparse.Namespace) -> tuple[int, int | None]:
    """``(--chunk-size, --chunk-chars)`` after checking them; unset: the harness defaults
    (:data:`~htp_retrieval.eval.retrieval.CHECKPOINT_DOCS`, ``CHECKPOINT_CHARS``), 0
    characters: no limit."""
    from htp_retrieval.eval.retrieval import CHECKPOINT_CHARS, CHECKPOINT_DOCS

    size, chars = args.chunk_size, args.chunk_chars
    if size is not None and size < 1:
        raise SystemExit(f"htp-retrieval eval: --chunk-size must be >= 1, got {size}")
    if chars is not None and chars < 0:
        raise SystemExit(f"htp-retrieval eval: --chunk-chars must be >= 0, got {chars}")
    return (CHECKPOINT_DOCS if size is None else size,
            CHECKPOINT_CHARS if chars is None else (chars or None))


def _preset_arg(args: argparse.Namespace, cmd: str) -> str | None:
    """``--preset``, checked up front so a bad file fails before any model loads."""
    if args.preset is None:
        return None
    from htp_retrieval.eval.calibrate import read_preset

    try:
        read_preset(args.preset)
    except (OSError, ValueError) as e:
        raise SystemExit(f"htp-retrieval {cmd}: --preset: {e}") from e
    return str(args.preset)


def _settings_args(args: argparse.Namespace, cmd: str) -> dict[str, Any]:
    """The config settings given as flags (``None``: not given) and ``--preset``."""
    return dict(k=args.k, max_length=args.max_length, overflow=args.overflow,
                tokens_per_block=args.tokens_per_block, max_blocks=args.max_blocks,
                min_block_tokens=args.min_block_tokens, long_budget=args.long_budget,
                short_budget=args.short_budget, tp_start=args.tp_start, tp_exit=args.tp_exit,
                output_layer=args.output_layer, segmenter=args.segmenter,
                preset=_preset_arg(args, cmd))


def _config_file(path: str, cmd: str) -> Any:
    """``--config FILE``: an HTPConfig JSON, or a results JSON holding one."""
    from htp_retrieval.config import read_config_file

    try:
        return read_config_file(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"htp-retrieval {cmd}: --config {path}: {e}") from e


def cmd_layout(args: argparse.Namespace) -> int:
    """``htp-retrieval layout``: print the placeholder layout one input gets (App. C)."""
    from htp_retrieval.encoder import HTPEncoder

    if args.config is not None:
        enc = HTPEncoder(args.model, _config_file(args.config, "layout"))
    else:
        enc = HTPEncoder(args.model, args.method, **_settings_args(args, "layout"))
    print(enc.describe(args.text, instruction=args.instruction))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print (or write) the resolved HTPConfig of a method on a model; loads no weights."""
    from htp_retrieval.config import HTPConfig

    try:
        cfg = HTPConfig.for_model(args.model, args.method, **_settings_args(args, "config"))
    except ValueError as e:
        raise SystemExit(f"htp-retrieval config: {e}") from e
    text = cfg.to_json(indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        print(f"wrote {args.output} (digest {cfg.digest()})", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_segmenters(args: argparse.Namespace) -> int:
    """``htp-retrieval segmenters``: time each sentence segmenter on a BEIR corpus
    (seconds, ms per document, sentences per document)."""
    import time

    from htp_retrieval.eval.data import load_beir
    from htp_retrieval.segmentation import get_segmenter

    data = load_beir(args.data, split=args.split)
    texts = [data.doc_text(d) for d in data.corpus][: args.max_docs or None]
    print("| segmenter | seconds | ms/doc | sentences/doc |\n|---|---|---|---|")
    for name in args.names.split(","):
        seg = get_segmenter(name)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        starts = seg.sentence_starts(texts)
        dt = time.perf_counter() - t0
        print(f"| {name} | {dt:.1f} | {1000 * dt / len(texts):.2f} "
              f"| {sum(map(len, starts)) / len(starts):.1f} |")
    return 0


def cmd_blocks(args: argparse.Namespace) -> int:
    """``htp-retrieval blocks``: placeholder blocks per document (and with ``--queries`` per
    query), fixed K vs the K policy."""
    import itertools

    import numpy as np

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.harness import encode_length, parse_list, resolve_data
    from htp_retrieval.methods import task_instructions

    _check_model_arg(args.model, "blocks")
    try:
        items = resolve_data(args.data, split=args.split, seed=args.seed,
                             context_lengths=parse_list(args.context_lengths))
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise SystemExit(f"htp-retrieval blocks: {e}") from e
    if any(it.kind == "sts" for it in items):
        raise SystemExit(f"htp-retrieval blocks: {args.data} is STS data (sentence pairs, no "
                         "documents); give a retrieval or evidence-span folder, needle or passkey")
    fixed = HTPEncoder(args.model, args.method, k=args.k, max_blocks=0, min_block_tokens=0,
                       long_budget=0, short_budget=0, max_length=args.max_length or 512)
    policy = HTPEncoder(fixed.model, args.method, tokenizer=fixed.tokenizer, k=args.k,
                        max_blocks=args.max_blocks, min_block_tokens=args.min_block_tokens,
                        long_budget=args.long_budget, short_budget=args.short_budget,
                        max_length=args.max_length or 512)
    budget = policy.max_blocks
    dense = policy.min_block_tokens
    long = policy.long_budget
    short = policy.short_budget
    length = (f"{args.max_length} text tokens" if args.max_length
              else "text tokens as `eval` encodes them (needle/passkey: whole documents)")
    print(f"{args.method}, {length}, minimum K "
          f"{policy.spec.sentences_per_block}, block budget {budget}"
          + (f", at least {dense} text tokens per block" if dense else "")
          + (f", at most {long[1]} blocks past {long[0]} text tokens" if long else "")
          + (f", at most {short[1]} up to {short[0]} text tokens" if short else ""))
    print(f"| data | K rule | texts | blocks/text min | mean | median | p95 | max "
          f"| texts over {budget or 'budget'} "
          "| placeholders / text tokens | text tokens median |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|")
    rule_name = (f"max_blocks={budget}" + (f", min_block_tokens={dense}" if dense else "")
                 + (f", long_budget={long[0]}:{long[1]}" if long else "")
                 + (f", short_budget={short[0]}:{short[1]}" if short else ""))
    for it in items:
        data = it.documents  # an evidence-span split: its whole documents
        texts = [data.doc_text(d) for d in data.corpus]
        query_instruction, document_instruction = task_instructions(data.name)
        # the length `eval` encodes this set with (needle/passkey: every document whole)
        fixed.max_length = policy.max_length = encode_length(
            fixed, data, max_length=args.max_length, context_length=it.context_length)
        label = f"{it.name}-{it.split}" + (
            f" @{it.context_length}" if it.context_length is not None else "")
        sets = [(label, texts, document_instruction)]
        if args.queries:
            sets.append((f"{label} queries", list(data.queries.values()), query_instruction))
        for (name, set_texts, instruction), (rule, enc) in itertools.product(
                sets, (("fixed", fixed), (rule_name, policy))):
            lays = enc.build_layouts(set_texts, instruction=instruction)
            n = np.array([len(lay.pst_positions) for lay in lays])
            share = sum(lay.n_placeholders for lay in lays) / sum(lay.n_text_tokens for lay in lays)
            over = int((n > budget).sum()) if budget else "-"
            print(f"| {name} | {rule} | {len(n)} | {n.min()} | {n.mean():.1f} "
                  f"| {np.median(n):.0f} | {np.percentile(n, 95):.0f} | {n.max()} "
                  f"| {over} | {share:.3f} "
                  f"| {np.median([lay.n_text_tokens for lay in lays]):.0f} |")
    return 0


def _parse_budget(text: str, name: str) -> tuple[int, int] | int:
    """``L:B_L`` or ``0`` (none) as an argparse value; errors name the flag's budget."""
    from htp_retrieval.layout import parse_long_budget

    try:
        return parse_long_budget(text, name=name) or 0
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _long_budget(text: str) -> tuple[int, int] | int:
    """argparse type of ``--long-budget``: ``L:B_L`` or ``0`` (none)."""
    return _parse_budget(text, "long budget")


def _short_budget(text: str) -> tuple[int, int] | int:
    """argparse type of ``--short-budget``: ``S:B_S`` or ``0`` (none)."""
    return _parse_budget(text, "short budget")


def _add_k_policy_args(p: argparse.ArgumentParser) -> None:
    """The adaptive-K policy flags (``eval``, ``blocks``): B, T, the long- and short-text
    budgets.

    The defaults named in the help are read from the ``htp`` spec and the family presets.
    """
    htp = METHODS["htp"]
    lb = "none" if htp.long_budget is None else "{}:{}".format(*htp.long_budget)
    families = ", ".join(f"{t}: {b[0]}:{b[1]}" for t, pre in LAYER_PRESETS.items()
                         if (b := pre.long_budget) is not None)
    p.add_argument("--max-blocks", type=int, default=None,
                   help="adaptive K: at most this many <PST>/<B-PST> blocks per document "
                   "(K grows to ceil(sentences / B)); 0 = fixed K; "
                   f"default: the method's (htp: {htp.max_blocks})")
    p.add_argument("--min-block-tokens", type=int, default=None,
                   help="adaptive K density cap T: at most one block per T text tokens "
                   "(budget min(B, tokens // T)); 0 = no cap; "
                   f"default: the method's (htp: {htp.min_block_tokens})")
    p.add_argument("--long-budget", type=_long_budget, default=None, metavar="L:B_L",
                   help="adaptive K long-text budget: at most B_L blocks past L text tokens; "
                   "0 = none; default: the --preset's, else the model family's "
                   f"({families}), else the method's "
                   f"(htp: {lb})")
    shorts = ", ".join(f"{t}: {b[0]}:{b[1]}" for t, pre in LAYER_PRESETS.items()
                       if (b := pre.short_budget) is not None) or "none sets one"
    p.add_argument("--short-budget", type=_short_budget, default=None, metavar="S:B_S",
                   help="adaptive K short-text budget: at most B_S blocks up to S text tokens "
                   "(research/ANALYSIS.md section 16); 0 = none; default: the --preset's, else "
                   f"the model family's ({shorts}) for methods with a density cap")


def _add_encoder_args(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="packaged name, .gguf path, local dir or hub id")
    if sweep:  # eval: comma lists, one result per value
        p.add_argument("--max-length", default=None,
                       help="max text tokens per text; comma list to sweep, e.g. "
                       "512,1024,2048,4096,8192 (default 512; needle/passkey: the context "
                       "length)")
        p.add_argument("--k", default=None,
                       help="sentences per block (K); comma list to sweep, e.g. "
                       "1,2,4,8,12,20,32,64 (paper Table 12)")
        p.add_argument("--tokens-per-block", default=None,
                       help="N for htp-fixed-tokens; comma list; 'auto' = text tokens // "
                       "sentences per document (paper Fig. 7)")
    else:
        p.add_argument("--max-length", type=int, default=None,
                       help="text tokens per forward pass (default: the model's context "
                       "window, at most 8,064)")
        p.add_argument("--overflow", choices=["window", "truncate", "error"], default="window",
                       help="a longer text: embed it in overlapping windows (default), "
                       "truncate it with a warning, or stop with an error")
        p.add_argument("--k", type=int, default=None, help="sentences per block (K)")
        p.add_argument("--tokens-per-block", type=int, default=None,
                       help="N for htp-fixed-tokens")
    _add_k_policy_args(p)
    p.add_argument("--tp-start", type=int, default=None)
    p.add_argument("--tp-exit", type=int, default=None)
    p.add_argument("--output-layer", type=int, default=None,
                   help="early exit as hidden_states[i], e.g. -2")
    p.add_argument("--preset", default=None,
                   help="calibration preset JSON (htp-retrieval calibrate): copy layers, exit "
                   "layer, summary, K policy; scaled to the model's depth if calibrated on "
                   "another; explicit flags win")
    p.add_argument("--segmenter", default="sentencizer",
                   choices=["sentencizer", "spacy", "pysbd", "regex"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=get_args(DTypeArg),
                   help="weight dtype; auto: bf16 on a GPU with bf16 or on a CPU with native "
                   "bf16 instructions where bf16 measured as fast as fp32 (a one-off "
                   "benchmark cached per machine), fp16 on an older GPU, else fp32")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens-per-batch", type=int, default=16384)


def tokenizer_threads_on() -> None:
    """Let the Rust tokenizer encode a batch on every core (``TOKENIZERS_PARALLELISM=true``)
    unless the variable is set. Set explicitly, so a later fork+exec prints no tokenizers
    warning; worker processes and Ray actors turn it off for themselves (measured in
    docs/PERFORMANCE.md section 5, "The tokenizer on every core")."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``htp-retrieval`` command."""
    tokenizer_threads_on()
    parser = argparse.ArgumentParser(prog="htp-retrieval", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("eval", help="retrieval/STS eval with sweeps (scores, cost)")
    p.add_argument("--data", required=True,
                   help="BEIR folder; LongEmbed folder or longembed:<task> (hub); needle or "
                   "passkey (generated, --seed); evidence-span folder (BEIR files plus "
                   "spans/<split>.jsonl, e.g. spans/qmsum --split dev) or needle-spans / "
                   "passkey-spans (chunk-level retrieval, --chunking); STS jsonl file or "
                   "folder with <split>.jsonl")
    p.add_argument("--split", default="test")
    p.add_argument("--methods", default=None,
                   help="comma-separated (default vanilla-mean,htp; with --config its "
                   "method); any of: " + ", ".join(METHODS))
    p.add_argument("--config", default=None, metavar="FILE",
                   help="evaluate one saved HTPConfig exactly (htp-retrieval config --output, "
                   "or a results JSON's htp_config): its method, max length and overflow; "
                   "the setting flags are refused beside it; results are named "
                   "<method>__cfg-<digest>")
    p.add_argument("--output", default="results", help="results folder")
    p.add_argument("--overwrite", action="store_true", help="recompute existing results")
    p.add_argument("--max-queries", type=int, default=0, help="subsample queries (0: all)")
    p.add_argument("--max-docs", type=int, default=0,
                   help="subsample documents: relevant ones + distractors (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    from htp_retrieval.eval.retrieval import CHECKPOINT_CHARS, CHECKPOINT_DOCS

    p.add_argument("--chunk-size", type=int, default=None,
                   help=f"documents per corpus checkpoint chunk at most (default "
                   f"{CHECKPOINT_DOCS}; an interrupted run resumes)")
    p.add_argument("--chunk-chars", type=int, default=None,
                   help=f"characters per corpus checkpoint chunk at most (default "
                   f"{CHECKPOINT_CHARS:,}; 0: no limit)")
    p.add_argument("--context-lengths", default=None,
                   help="needle/passkey context lengths in tokens, comma list "
                   "(default 256,512,1024,2048,4096,8192; up to 32768)")
    p.add_argument("--synthetic-tokenizer", default=None,
                   help="tokenizer measuring needle/passkey lengths (default: packaged SmolLM2)")
    p.add_argument("--haystack", default=None,
                   help="folder of Paul Graham essays for needle (default: "
                   "../shared/data/haystack/paul_graham_essays)")
    p.add_argument("--padding-side", default="right", choices=["right", "left"])
    p.add_argument("--verbose", action="store_true",
                   help="print the placeholder layout of one input per method")
    p.add_argument("--chunking", default="naive",
                   help="evidence-span data (spans/<split>.jsonl): comma list of naive "
                   "(chunks embedded alone), late (pooled from one pass over the document), "
                   "late-mix (mean of the two)")
    p.add_argument("--center-queries", default=None, metavar="SPEC",
                   help="also score with vectors centred on the corpus mean and queries on "
                   "the mean of a query sample: DIR:SPLIT (another split of a BEIR dataset, "
                   "e.g. ../shared/data/beir/scifact:train), a file of queries (one per line "
                   "or queries.jsonl), or crossfit (each half of the evaluated queries "
                   "centred on the other half's mean; for dev splits); STS: both sentences on "
                   "one mean (e.g. ../shared/data/sts/stsb:train); columns '... centred'")
    p.add_argument("--chunk-tokens", type=int, default=256,
                   help="evidence-span data: chunk size in tokens (default 256)")
    p.add_argument("--chunk-overlap", type=int, default=0,
                   help="evidence-span data: overlap of consecutive chunks in tokens")
    p.add_argument("--late-window", type=int, default=None,
                   help="late chunking: text tokens per forward pass (default: the model's "
                   "window, at most 8,064)")
    _add_encoder_args(p, sweep=True)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("layout", help="print the placeholder layout of one input")
    p.add_argument("text")
    p.add_argument("--method", default="htp")
    p.add_argument("--instruction", default=None)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a saved HTPConfig JSON (htp-retrieval config --output), or a results "
                   "JSON with an htp_config key; replaces --method and the setting flags")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_layout)

    p = sub.add_parser("config", help="print the resolved HTPConfig of a method on a model "
                       "(every setting, the family's and method's defaults filled in; no "
                       "weights are loaded)")
    p.add_argument("--method", default="htp")
    p.add_argument("--output", default=None, metavar="FILE",
                   help="write the JSON here (for ingest --config, layout --config)")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_config)

    from htp_retrieval.eval.bench import add_subcommands as add_bench
    from htp_retrieval.eval.calibrate import add_subcommands as add_calibrate
    from htp_retrieval.eval.chunk_bench import add_subcommand as add_bench_chunks
    from htp_retrieval.eval.commands import add_subcommands as add_eval_commands
    from htp_retrieval.eval.parity import add_subcommands as add_parity
    from htp_retrieval.integrations.cli import add_subcommands

    add_subcommands(sub)  # ingest, query
    add_eval_commands(sub)  # report, mteb
    add_parity(sub)  # the official repo's script names
    add_bench(sub)  # bench
    add_bench_chunks(sub)  # bench-chunks
    add_calibrate(sub)  # calibrate

    p = sub.add_parser("segmenters", help="time the sentence segmenters on a BEIR corpus")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--names", default="regex,sentencizer,pysbd,spacy")
    p.add_argument("--max-docs", type=int, default=0)
    p.set_defaults(func=cmd_segmenters)

    p = sub.add_parser("blocks", help="<PST>/<B-PST> blocks per document: fixed K vs adaptive K",
                       description="Build the layouts of every document of a dataset and print "
                       "the blocks per document with fixed K and with the K policy "
                       "(max_blocks), and the placeholders' share of the text tokens.")
    p.add_argument("--data", required=True, help="BEIR or LongEmbed folder, needle, passkey")
    p.add_argument("--split", default="test")
    p.add_argument("--context-lengths", default=None,
                   help="needle/passkey: comma list of context lengths (default 256 ... 8192)")
    p.add_argument("--seed", type=int, default=0, help="needle/passkey generation seed")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--method", default="htp")
    p.add_argument("--k", type=int, default=None, help="minimum sentences per block (K)")
    _add_k_policy_args(p)
    p.add_argument("--max-length", type=int, default=None,
                   help="max text tokens per document (default: what `eval` uses: for "
                   "needle/passkey whole documents, otherwise 512)")
    p.add_argument("--queries", action="store_true",
                   help="also lay out the queries, with the task's query instruction as "
                   "`eval` encodes them (rows '<data> queries')")
    p.set_defaults(func=cmd_blocks)

    return run_parsed(parser, sub, argv)


def run_parsed(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction,
               argv: list[str] | None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``, kept as ``args.argv`` for the recorded
    command), silence every progress bar under ``--quiet``, and run the subcommand.

    Every subcommand of ``sub`` that lacks one gets ``--debug``: show the traceback of an
    ``ImportError`` instead of its one line.

    Returns:
        The subcommand's exit status.

    Raises:
        SystemExit: with one line naming the subcommand and the pip command when a packaged
            model's or an optional extra's package is missing (an ``ImportError`` inside),
            unless ``--debug`` was given.
    """
    for sp in {id(sp): sp for sp in sub.choices.values()}.values():  # aliases share one
        try:
            sp.add_argument("--debug", action="store_true",
                            help="show the full traceback of an error instead of one line")
        except argparse.ArgumentError:  # the subcommand has its own --debug
            pass
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if getattr(args, "quiet", False):  # every bar, model loading included
        from htp_retrieval.integrations.cli import quiet_loading

        quiet_loading()
    try:
        return int(args.func(args))
    except ImportError as e:  # a packaged model or extra not installed; e names the pip command
        if args.debug:
            raise
        raise SystemExit(f"{parser.prog} {args.cmd}: {e} (--debug: traceback)") from e


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
