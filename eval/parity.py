"""Subcommands with the official HTP repo's script names and flags (seed parity).

The official README runs ``python mteb_retrieval_tasks.py --model_method ... --architecture
...``; here the same line runs as ``htp-retrieval mteb_retrieval_tasks ...`` (the names with
``.py`` and with dashes work too): ``mteb_retrieval_tasks`` (BEIR), ``longembed_retrieval_tasks``
(LongEmbed), ``synthetic_retrieval_tasks`` (needle/passkey) and ``mteb_sts_tasks`` (STS).

Presets come from a ``config.yaml`` laid out like the official one (``models``,
``architectures``, ``data``): the packaged ``htp_retrieval/config.yaml``, with
``./config.yaml`` or ``--config FILE`` merged over it. ``--model_method`` and
``--use_which_plan`` map to a method with :func:`htp_retrieval.methods.plan_to_method`;
``--pooling`` overrides the pooling. The runs go through
:func:`htp_retrieval.eval.harness.run_eval`, like ``htp-retrieval eval``, and write the same
results JSONs (``config["parity"]`` records the official settings).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

from htp_retrieval.models import DTypeName

SCRIPTS: dict[str, str] = {
    "mteb_retrieval_tasks": "retrieval_task",
    "longembed_retrieval_tasks": "long_context_task",
    "synthetic_retrieval_tasks": "long_context_synthetic_task",
    "mteb_sts_tasks": "sts_task",
}
"""Official script name -> its ``data`` section in config.yaml."""
PACKAGED_CONFIG = Path(__file__).resolve().parents[1] / "htp_retrieval" / "config.yaml"
DATA_ENV = "HTP_RETRIEVAL_DATA"


def _packaged_config() -> Path:
    import htp_retrieval

    p = Path(htp_retrieval.__file__).resolve().parent / "config.yaml"
    return p if p.exists() else PACKAGED_CONFIG


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """The packaged config.yaml, with ``path`` (or ``./config.yaml``) merged over it.

    Raises:
        ImportError: if PyYAML is missing.
        FileNotFoundError: if an explicit ``path`` does not exist.
        ValueError: if a file is not a YAML mapping.
    """
    try:
        import yaml
    except ImportError as e:  # pragma: no cover
        raise ImportError("pip install pyyaml (htp-retrieval[eval])") from e

    def read(p: Path) -> dict[str, Any]:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{p}: expected a YAML mapping")
        return data

    cfg = read(_packaged_config())
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config file not found: {p}")
        cfg = _merge(cfg, read(p))
    elif Path("config.yaml").exists() and Path("config.yaml").resolve() != _packaged_config():
        cfg = _merge(cfg, read(Path("config.yaml")))
    return cfg


def _split_names(values: list[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [n.strip() for v in values for n in str(v).split(",") if n.strip()]


def find_local(
    name: str, section: dict[str, Any], cfg: dict[str, Any]
) -> tuple[Path | None, list[Path]]:
    """Find a dataset folder (or STS file) by name.

    Order: ``section["paths"][name]``; then ``$HTP_RETRIEVAL_DATA`` and each of
    ``cfg["data_dirs"]`` (relative ones from the working directory, then the repository
    root) joined with ``section["subfolder"]`` and the lower-case name (after
    ``section["aliases"]``).

    Returns:
        ``(path or None, every path looked at)``.
    """
    key = name.lower()
    if key.endswith("-sts"):
        key = key[: -len("-sts")]
    key = (section.get("aliases") or {}).get(key, key)
    looked: list[Path] = []
    paths = section.get("paths") or {}
    for explicit in (paths.get(name), paths.get(key)):
        if explicit:
            looked.append(Path(explicit))
            if Path(explicit).exists():
                return Path(explicit), looked
    dirs = [os.environ[DATA_ENV]] if os.environ.get(DATA_ENV) else []
    dirs += list(cfg.get("data_dirs") or [])
    repo = Path(__file__).resolve().parents[1]
    sub = section.get("subfolder") or ""
    for d in dirs:
        bases = [Path(d)] if Path(d).is_absolute() else [Path.cwd() / d, repo / d]
        for b in bases:
            c = (b / sub / key).resolve()
            if c not in looked:
                looked.append(c)
            if c.exists():
                return c, looked
            if c.with_suffix(".jsonl").is_file():
                return c.with_suffix(".jsonl"), looked
    return None, looked


def with_pooling(spec: Any, pooling: str | None) -> Any:
    """The method with its pooling replaced (``--pooling``).

    Returns a built-in method when one matches (``vanilla-mean`` + ``last`` is
    ``vanilla-last``), else a copy named ``<method>-<pooling>-pool``.

    Raises:
        ValueError: for a pooling other than ``mean``/``last``.
    """
    from htp_retrieval.methods import METHODS

    if pooling is None or pooling == spec.pooling:
        return spec
    if pooling not in ("mean", "last"):
        raise ValueError(f"--pooling must be 'mean' or 'last', got {pooling!r}")
    new = replace(spec, pooling=pooling)
    for m in METHODS.values():
        if replace(m, name=new.name, description=new.description) == new:
            return m
    return replace(new, name=f"{spec.name}-{pooling}-pool")


def _parse_bool(text: str | None) -> bool:
    return str(text).strip().lower() not in ("", "0", "false", "no", "none")


def _add_official_args(p: argparse.ArgumentParser, *, synthetic: bool) -> None:
    g = p.add_argument_group("official flags (snap-research/HTP)")
    g.add_argument("--model_method", default=None,
                   help="official method name (vanilla-mean-pool, echo-mean-pool, "
                   "tp-mean-pool, tp-prompteol-last-pool, ...) or ours")
    g.add_argument("--architecture", default=None, help="architecture preset in config.yaml")
    g.add_argument("--use_which_plan", default=None,
                   help="vanilla | tp | tp_sentence | tp_sentence_begin (= HTP)")
    g.add_argument("--pooling", default=None, choices=["mean", "last"],
                   help="override the pooling")
    g.add_argument("--output_layer", type=int, default=None,
                   help="early exit as hidden_states[i], e.g. -2")
    g.add_argument("--model_name_or_path", default=None,
                   help="model instead of the architecture's (hub id, local dir, packaged "
                   "name, .gguf)")
    g.add_argument("--tp_starting_index", type=int, default=None, help="first copy layer")
    g.add_argument("--tp_exiting_index", type=int, default=None,
                   help="copies stop before this layer (exclusive)")
    g.add_argument("--padding_side", default=None, choices=["left", "right"])
    g.add_argument("--retrieval_datasets", nargs="+", default=None,
                   help="datasets (space- or comma-separated), overriding config.yaml")
    g.add_argument("--verbose", nargs="?", type=int, const=1, default=0,
                   help="print the placeholder layout of one input (--verbose or --verbose 1)")
    g.add_argument("--global_sentence_tp", nargs="?", const="true", default=None,
                   help="accepted for compatibility; no effect (HTP's global <B-PST> copies "
                   "are chosen with --use_which_plan tp_sentence_begin)")
    g.add_argument("--cuda_visible_devices", default=None,
                   help="sets CUDA_VISIBLE_DEVICES, e.g. 0,1")
    if synthetic:
        g.add_argument("--context_length", default=None,
                       help="context length(s) in tokens, comma list (overrides config.yaml)")
    o = p.add_argument_group("htp-retrieval options")
    o.add_argument("--config", default=None, help="config.yaml merged over the packaged one")
    o.add_argument("--output", default="results", help="results folder")
    o.add_argument("--overwrite", action="store_true", help="recompute existing results")
    o.add_argument("--max_length", "--max-length", type=int, default=None,
                   help="max text tokens (default: config.yaml data section)")
    o.add_argument("--k", type=int, default=None, help="sentences per block (K)")
    o.add_argument("--max_queries", "--max-queries", type=int, default=0,
                   help="subsample queries (STS: pairs; synthetic: queries per length)")
    o.add_argument("--max_docs", "--max-docs", type=int, default=0,
                   help="subsample documents (synthetic: documents per length)")
    o.add_argument("--seed", type=int, default=None, help="subsampling / generation seed")
    o.add_argument("--device", default="auto")
    o.add_argument("--dtype", default="bfloat16", choices=get_args(DTypeName))
    o.add_argument("--batch_size", "--batch-size", type=int, default=32)
    o.add_argument("--quiet", action="store_true", help="no progress bars")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register the official script names as ``htp-retrieval`` subcommands on ``sub``."""
    helps = {
        "mteb_retrieval_tasks": "official-style BEIR retrieval run (config.yaml presets)",
        "longembed_retrieval_tasks": "official-style LongEmbed retrieval run",
        "synthetic_retrieval_tasks": "official-style needle/passkey run (generated data)",
        "mteb_sts_tasks": "official-style STS run (Spearman, float gold scores)",
    }
    for name, section in SCRIPTS.items():
        dashed = name.replace("_", "-")
        p = sub.add_parser(name, aliases=[f"{name}.py", dashed, f"{dashed}.py"],
                           help=helps[name])
        _add_official_args(p, synthetic=section == "long_context_synthetic_task")
        p.set_defaults(func=cmd_parity, parity_script=name, parity_section=section)


def _fail(msg: str) -> SystemExit:
    return SystemExit(f"error: {msg}")


def _resolve_items(
    args: argparse.Namespace, section_name: str, section: dict[str, Any], cfg: dict[str, Any]
) -> tuple[list[Any], list[str]]:
    from htp_retrieval.eval.harness import parse_list, resolve_data

    tasks = _split_names(args.retrieval_datasets) or _split_names(section.get("tasks"))
    if not tasks:
        raise _fail(f"no datasets: set data.{section_name}.tasks in config.yaml or pass "
                    "--retrieval_datasets")
    split = str(section.get("split") or "test")
    seed = args.seed if args.seed is not None else int(section.get("seed") or 0)
    items: list[Any] = []
    missing: list[str] = []
    if section_name == "long_context_synthetic_task":
        lengths = parse_list(getattr(args, "context_length", None))
        if lengths is None:
            raw = section.get("context_length") or section.get("context_lengths")
            lengths = parse_list(",".join(map(str, raw)) if isinstance(raw, list) else raw)
        for t in tasks:
            if t.lower() not in ("needle", "passkey"):
                raise _fail(f"synthetic task {t!r} unknown; valid: needle, passkey")
            items += resolve_data(t.lower(), seed=seed, context_lengths=lengths,
                                  max_queries=args.max_queries, max_docs=args.max_docs)
        return items, tasks
    for t in tasks:
        path, looked = find_local(t, section, cfg)
        if path is None:
            missing.append(f"{t!r} (looked in: {', '.join(map(str, looked))})")
            continue
        items += resolve_data(str(path), split=split, seed=seed,
                              max_queries=args.max_queries, max_docs=args.max_docs)
    if missing:
        raise _fail(
            "dataset(s) not found locally: " + "; ".join(missing) + ". Put the dataset there "
            f"(BEIR/LongEmbed folder or STS jsonl), set data.{section_name}.paths in a "
            f"config.yaml, or set ${DATA_ENV}.")
    return items, tasks


@dataclass
class OfficialRun:
    """What an official command line resolves to.

    Attributes:
        model_method, architecture, plan: The official names used.
        spec: Our method (:func:`~htp_retrieval.methods.plan_to_method` + ``--pooling``).
        model: Model to load.
        tp_start, tp_exit, output_layer: Layer settings (``None``: model preset).
        padding_side: ``left`` or ``right``.
    """

    model_method: str
    architecture: str
    plan: str | None
    spec: Any
    model: str
    tp_start: int | None
    tp_exit: int | None
    output_layer: int | None
    padding_side: str


def resolve_official(args: argparse.Namespace, cfg: dict[str, Any]) -> OfficialRun:
    """Apply the official precedence: flags over ``architectures``/``models`` presets.

    Raises:
        SystemExit: for an unknown model method or architecture (the message lists the
            available ones), or a bad pooling.
    """
    from htp_retrieval.methods import get_method, plan_to_method

    models = cfg.get("models") or {}
    archs = cfg.get("architectures") or {}
    model_method = args.model_method or cfg.get("default_model_config") or "vanilla-mean-pool"
    try:
        get_method(model_method)
    except ValueError as e:
        raise _fail(f"model method {model_method!r} not found; available in config.yaml: "
                    f"{', '.join(models)} ({e})") from e
    architecture = args.architecture or cfg.get("default_architecture_config")
    if architecture not in archs:
        raise _fail(f"architecture {architecture!r} not found; available: {', '.join(archs)}")
    arch = dict(archs[architecture] or {})
    preset = dict(models.get(model_method) or {})
    plan = args.use_which_plan or arch.get("use_which_plan")
    try:
        spec = with_pooling(plan_to_method(model_method, plan), args.pooling or preset.get("pooling"))
    except ValueError as e:
        raise _fail(str(e)) from e

    def pick(flag: Any, key: str) -> Any:
        return flag if flag is not None else arch.get(key)

    model = args.model_name_or_path or arch.get("model_name_or_path")
    if not model:
        raise _fail(f"architecture {architecture!r} has no model_name_or_path")
    return OfficialRun(
        model_method=model_method, architecture=str(architecture), plan=plan, spec=spec,
        model=str(model), tp_start=pick(args.tp_starting_index, "tp_starting_index"),
        tp_exit=pick(args.tp_exiting_index, "tp_exiting_index"),
        output_layer=pick(args.output_layer, "output_layer"),
        padding_side=args.padding_side or preset.get("padding_side") or "right")


def cmd_parity(args: argparse.Namespace) -> int:
    """Run one official script's job through the shared harness."""
    from htp_retrieval.eval.harness import EvalSettings, format_results, run_eval

    if args.cuda_visible_devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.cuda_visible_devices)
    cfg = load_config(args.config)
    run = resolve_official(args, cfg)
    model_method, architecture, plan, spec = run.model_method, run.architecture, run.plan, run.spec
    model, padding = run.model, run.padding_side
    tp_start, tp_exit, output_layer = run.tp_start, run.tp_exit, run.output_layer
    section_name = args.parity_section
    section = dict((cfg.get("data") or {}).get(section_name) or {})
    max_length = args.max_length or section.get("max_length")
    print(f"""
Configuration:
-------------
Script                  : {args.parity_script}
Model Method            : {model_method}  ->  method {spec.name}
Architecture            : {architecture}
Model                   : {model}
Pooling Method          : {spec.pooling}
Padding Side            : {padding}
Output Layer Index      : {output_layer}
Plan                    : {plan}
TP Starting layer Index : {tp_start}
TP Exiting layer Index  : {tp_exit}
Max Length              : {max_length if max_length else 'cover each context length'}
Datasets                : {', '.join(_split_names(args.retrieval_datasets)
                                     or _split_names(section.get('tasks')))}
""".rstrip() + "\n")
    items, _ = _resolve_items(args, section_name, section, cfg)
    if args.global_sentence_tp is not None and _parse_bool(args.global_sentence_tp):
        print("note: --global_sentence_tp has no effect; use --use_which_plan "
              "tp_sentence_begin for HTP's global copies", file=sys.stderr)
    argv = getattr(args, "argv", None) or sys.argv[1:]
    settings = EvalSettings(
        model=str(model), methods=[spec], max_lengths=[int(max_length)] if max_length else None,
        ks=[args.k], tp_start=tp_start, tp_exit=tp_exit, output_layer=output_layer,
        device=args.device, dtype=args.dtype, padding_side=padding, batch_size=args.batch_size,
        output=args.output, overwrite=args.overwrite,
        command="htp-retrieval " + " ".join(shlex.quote(a) for a in argv),
        show_progress_bar=not args.quiet, max_queries=args.max_queries,
        max_docs=args.max_docs,
        seed=args.seed if args.seed is not None else int(section.get("seed") or 0),
        verbose=bool(args.verbose),
        extra_config={"parity": {"script": args.parity_script, "model_method": model_method,
                                 "architecture": architecture, "use_which_plan": plan,
                                 "pooling": spec.pooling}})
    try:
        results = run_eval(items, settings)
    except OSError as e:  # a hub id that cannot be fetched (offline, gated, misspelled)
        if str(model) not in str(e) and "huggingface" not in str(e).lower():
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _fail(
            f"could not load model {model!r} of architecture {architecture!r}: {first} "
            "Pass --model_name_or_path with a local folder, a .gguf file or a packaged model "
            "(smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, gemma-3-270m), or use "
            "--architecture smollm2-tp.") from e
    print(format_results(results))
    return 0


__all__ = ["add_subcommands", "cmd_parity", "resolve_official", "OfficialRun", "load_config",
           "find_local", "with_pooling", "SCRIPTS"]
