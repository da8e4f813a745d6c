"""``htp-retrieval calibrate``: choose HTP's copy layers, exit layer and K policy for a model.

Coordinate search on a validation split that is not the test split (default: SciFact's
training claims, ``qrels/train.tsv``), within a time budget. Each candidate is scored as
HTP's NDCG@10 among candidates that beat vanilla-mean at the same exit layer by at least
``min_gain`` points (default 1.0); while none does, by the HTP - vanilla-mean
gain. So an exit layer is not chosen for what it does to vanilla pooling (a gain that
comes from a layer where both are poor), nor for a gain alone. The result is a preset JSON that
:class:`~htp_retrieval.HTPEncoder` loads with ``preset=path``.

This answers the paper's open question on layer choice (Sec. 7, Limitations) per model,
instead of carrying Mistral's or Qwen2's layers over.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# a calibration preset is a partial HTPConfig: its keys, reader and depth scaling live there
from htp_retrieval.config import PRESET_KEYS, read_preset, scale_layers  # noqa: F401
from htp_retrieval.files import atomic_write

FIXED_LENGTH: dict[str, Any] = {"max_length": 512, "overflow": "truncate"}
"""Encoder length settings of calibration runs: the first 512 tokens, as ``eval`` reads
SciFact (a long set passes its own ``max_length``)."""


@dataclass
class Trial:
    """One scored candidate.

    Attributes:
        settings: Encoder keyword arguments (a subset of :data:`PRESET_KEYS`).
        htp: HTP NDCG@10 on the validation split (percent).
        vanilla: vanilla-mean NDCG@10 at the same exit layer (percent).
        seconds: Wall time of the trial (both encodes), in seconds.
        long: Whether it was scored on the long validation sets.
        parts: Per long set, its two scores.
    """

    settings: dict[str, Any]
    htp: float
    vanilla: float
    seconds: float
    long: bool = False
    """Scored on the long validation sets (the long-budget axis) instead of the main one;
    ``htp`` and ``vanilla`` are then means over those sets."""
    parts: dict[str, list[float]] | None = None
    """Long trials: ``set name -> [htp, vanilla-mean]`` NDCG@10 per long set."""

    @property
    def gain(self) -> float:
        """HTP minus vanilla-mean, NDCG@10 points."""
        return self.htp - self.vanilla

    def objective(self, min_gain: float) -> tuple[int, float]:
        """What the search maximises: ``(1, HTP NDCG@10)`` when the gain is at least
        ``min_gain`` points, else ``(0, gain)``, so any qualifying candidate beats every
        non-qualifying one, and among qualifying ones the better retriever wins.

        A gain-only objective would have taken SmolLM2's exit at layer 22 of 30
        (``output_layer=-9``: gain +4.54, HTP 29.71) over layer 29 (``-2``: gain +4.45, HTP
        52.89) in the first calibrate run."""
        g = self.gain
        return (1, self.htp) if g >= min_gain else (0, g)


@dataclass
class Calibration:
    """The outcome of :func:`calibrate` (what the preset JSON holds).

    Attributes:
        model: Model name.
        n_layers: Decoder layers L.
        best: The chosen settings (encoder keyword arguments).
        best_gain: Its HTP - vanilla-mean NDCG@10 gain on the validation split (points).
        trials: Every trial in the order run.
        data: Validation data description (path, split, subsample).
        budget_seconds: The time budget given.
        command: The command that produced it.
        long_data: The long validation sets of the long-budget axis (``None``: not searched;
            the preset then leaves the long budget at the method's default).
        best_long_gain: The chosen long budget's HTP - vanilla-mean NDCG@10 gain, mean over
            those sets.
        min_gain: The gain (NDCG@10 points) a candidate needed before its own NDCG@10
            decided (:meth:`Trial.objective`).
    """

    model: str
    n_layers: int
    best: dict[str, Any]
    best_gain: float
    trials: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    budget_seconds: float = 0.0
    command: str = ""
    long_data: list[dict[str, Any]] | None = None
    best_long_gain: float | None = None
    min_gain: float = 1.0

    def save(self, path: str | Path) -> None:
        """Write the preset JSON (parents created)."""
        with atomic_write(path) as f:
            f.write(json.dumps(asdict(self), indent=2, sort_keys=True))


def load_preset(path: str | Path, *, n_layers: int | None = None) -> dict[str, Any]:
    """Encoder keyword arguments from a calibration preset JSON.

    Args:
        path: The preset file (see :func:`read_preset`).
        n_layers: Decoder layers of the model it will be used with. When the preset was
            calibrated on another depth, its layers are carried over by
            :func:`scale_layers`; ``None`` returns them as written.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: if it holds no ``best`` settings or unknown keys.
    """
    best, depth = read_preset(path)
    if n_layers is not None and depth is not None:
        return scale_layers(best, depth, n_layers)
    return best


def candidate_axes(n_layers: int) -> dict[str, list[Any]]:
    """The search space, relative to depth L so it transfers across model sizes.

    Returns:
        ``axis -> values``; ``window`` values are ``(tp_start, tp_exit)`` pairs.
    """
    q = max(1, round(n_layers / 4))
    windows = sorted({(1, max(2, q)), (1, max(2, 2 * q)), (q, 2 * q), (2 * q, 3 * q),
                      (1, 3 * q), (q, 3 * q), (1, max(2, n_layers - 1))})
    return {
        "output_layer": [-2, -1, -3, -(q + 1)],
        "window": windows,
        "summary": ["mean", "last"],
        "max_blocks": [0, 32, 16, 8, 4],  # 0: fixed K
        "min_block_tokens": [64, 0, 32, 128],  # density cap T; 0: none
    }


@dataclass(frozen=True)
class LongSet:
    """Long validation documents for the long-budget axis of :func:`calibrate`.

    Attributes:
        name: How the set is recorded, e.g. ``needle-2048-seed1``.
        data: A :class:`~htp_retrieval.eval.data.BeirData`.
        max_length: The context length its documents were generated at; they are encoded
            whole (:func:`~htp_retrieval.eval.harness.encode_length`), as ``eval`` does.
    """

    name: str
    data: Any
    max_length: int


LONG_BUDGETS: tuple[Any, ...] = (0, [1024, 4], [1024, 8], [1024, 16])
"""Candidates of the long-budget axis: none (``max_blocks`` alone binds), or at most B_L
blocks past 1024 text tokens (the threshold ``htp`` ships, research/ANALYSIS.md section 13)."""


def _ids_digest(data: Any) -> str:
    """A short digest of a split's query and document ids (which subsample it is)."""
    import hashlib

    h = hashlib.sha1()
    for ids in (sorted(data.queries), sorted(data.corpus)):
        h.update("\x1f".join(map(str, ids)).encode())
        h.update(b"\x1e")
    return h.hexdigest()[:16]


def journal_header(model: str, data: Any, split: str,
                   long_sets: Sequence[LongSet] = ()) -> dict[str, Any]:
    """What a trial's scores depend on: the model and the exact validation documents.

    A journal (see :class:`TrialJournal`) is reused only when its header equals this one;
    the budget, ``rounds`` and ``min_gain`` may change between runs (they steer the search,
    not the scores).
    """
    return {
        "journal": "htp-retrieval calibrate",
        "model": model,
        "data": {"name": data.name, "split": split, "n_queries": len(data.queries),
                 "n_docs": len(data.corpus), "ids": _ids_digest(data)},
        "long_data": [{"name": ls.name, "max_length": ls.max_length,
                       "ids": _ids_digest(ls.data)} for ls in long_sets],
    }


class TrialJournal:
    """An append-only JSON-lines record of a calibration's scored trials, so that an
    interrupted ``calibrate`` (a killed job, a machine restart) resumes where it stopped
    instead of re-encoding every trial; a later run with a larger budget extends it.

    Line 1 is :func:`journal_header`; then one line per vanilla-mean score
    (``{"vanilla": [tag, exit_layer], "ndcg": ...}``) and per trial (``{"trial": {...}}``,
    :class:`Trial` fields), each written and flushed as soon as it is scored.

    Args:
        path: The journal file (parents created).
        header: This run's :func:`journal_header`.
        fresh: Start over: discard an existing journal at ``path``.

    Raises:
        ValueError: if an existing journal was written for another model or other
            validation documents (naming the file and the differing key), or a line of it
            is not JSON (naming the line number).
    """

    def __init__(self, path: str | Path, header: dict[str, Any], *, fresh: bool = False) -> None:
        self.path = Path(path)
        self.trials: dict[str, Trial] = {}
        self.vanilla: dict[tuple[str | None, int], float] = {}
        lines = self.path.read_text().splitlines() if self.path.exists() and not fresh else []
        records = []
        torn = False
        for i, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines):  # the line a kill cut short: dropped, rewritten below
                    lines, torn = lines[:-1], True
                    break
                raise ValueError(f"{self.path}:{i}: not a JSON line") from None
        if records:
            diff = [k for k in header if records[0].get(k) != header[k]]
            if diff:
                raise ValueError(
                    f"{self.path} was written for another calibration ({diff[0]}: "
                    f"{records[0].get(diff[0])!r} != {header[diff[0]]!r}); pass another "
                    "--journal, or --fresh to discard it")
            for rec in records[1:]:
                if "trial" in rec:
                    t = Trial(**rec["trial"])
                    self.trials[self.key(t.settings, t.long)] = t
                elif "vanilla" in rec:
                    tag, layer = rec["vanilla"]
                    self.vanilla[tag, int(layer)] = float(rec["ndcg"])
            if torn:  # so that appends start on a line of their own
                self.path.write_text("".join(x + "\n" for x in lines))
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(header, sort_keys=True) + "\n")

    @staticmethod
    def key(settings: dict[str, Any], long: bool) -> str:
        """The identity of a candidate: its settings and which data scored it."""
        return json.dumps([settings, long], sort_keys=True)

    def _append(self, rec: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()

    def add_vanilla(self, tag: str | None, exit_layer: int, ndcg: float) -> None:
        """Record vanilla-mean's NDCG@10 at an exit layer (``tag``: long set name or None)."""
        self.vanilla[tag, exit_layer] = ndcg
        self._append({"vanilla": [tag, exit_layer], "ndcg": ndcg})

    def add_trial(self, trial: Trial) -> None:
        """Record a scored trial."""
        self.trials[self.key(trial.settings, trial.long)] = trial
        self._append({"trial": asdict(trial)})


def calibrate(
    model: str,
    data: Any,
    *,
    split: str,
    budget_seconds: float,
    start: dict[str, Any] | None = None,
    rounds: int = 2,
    log: Any = None,
    long_sets: Sequence[LongSet] = (),
    min_gain: float = 1.0,
    journal: TrialJournal | None = None,
) -> Calibration:
    """Coordinate search over :func:`candidate_axes` within a time budget.

    Starting from ``start`` (default: the model family's preset), each axis in turn is
    set to the value that maximises :meth:`Trial.objective` (HTP NDCG@10 among candidates
    at least ``min_gain`` points above vanilla-mean at their exit layer, else the gain),
    for ``rounds`` passes or until the budget is spent (the trial running when it runs out
    completes).
    vanilla-mean depends only on the exit layer, so it is scored once per exit layer.

    A validation split of short texts (SciFact abstracts, 512 tokens) never reaches the
    long-text budget of adaptive K, so that axis needs documents past its threshold: with
    ``long_sets`` the search starts with one pass over :data:`LONG_BUDGETS` at the starting
    settings, scored as HTP - vanilla-mean NDCG@10 averaged over those sets (each at its
    own length), and the main search goes on from the best of them with the time left. It
    runs first so that the main search cannot use up the time it needs (its first
    candidate always runs; the rest only within the budget). Without long sets the preset
    leaves the method's long budget in place.

    Args:
        model: Model name or path (as for :class:`~htp_retrieval.HTPEncoder`).
        data: A :class:`~htp_retrieval.eval.data.BeirData` validation split.
        split: Its split name (recorded).
        budget_seconds: Wall-time budget in seconds.
        start: Initial settings.
        rounds: Passes over the axes.
        log: File-like for progress lines (default stderr).
        long_sets: :class:`LongSet` s of long documents for the long-budget axis (e.g.
            needle at 2048 tokens on a seed other than the test seed); empty: not searched.
        min_gain: NDCG@10 points over vanilla-mean a candidate needs before its own
            NDCG@10 decides (see :meth:`Trial.objective`).
        journal: A :class:`TrialJournal` (header from :func:`journal_header` for the same
            model and data): trials it holds are reused instead of run, with their recorded
            seconds counted against the budget, so a resumed run takes the path an
            uninterrupted one would have; new scores are appended to it as they come.

    Returns:
        The :class:`Calibration`.

    Raises:
        ValueError: if two long sets share a name.
    """
    if len({ls.name for ls in long_sets}) != len(long_sets):
        raise ValueError(f"long sets need distinct names, got {[ls.name for ls in long_sets]}")
    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.harness import encode_length
    from htp_retrieval.eval.retrieval import run_retrieval

    log = log or sys.stderr
    t_begin = time.perf_counter()
    probe = HTPEncoder(model, "htp", max_length=512, overflow="truncate")
    n_layers = probe.n_layers
    cur: dict[str, Any] = dict(start or {"tp_start": probe.tp_start, "tp_exit": probe.tp_exit,
                                         "output_layer": probe.output_layer,
                                         "summary": probe.summary,
                                         "max_blocks": probe.max_blocks or 0,
                                         "min_block_tokens": probe.min_block_tokens or 0})
    # long documents are encoded whole, as `eval` encodes them (the synthetic tokenizer
    # that measured them may count fewer tokens than this model's)
    long_lengths = {ls.name: encode_length(probe, ls.data, context_length=ls.max_length)
                    for ls in long_sets}
    vanilla_at: dict[tuple[str | None, int], float] = dict(journal.vanilla) if journal else {}
    trials: list[Trial] = []
    done: dict[str, Trial] = {}
    replayed = 0.0  # seconds of trials taken from the journal, counted against the budget

    def spent() -> float:
        return time.perf_counter() - t_begin + replayed

    def ndcg_pair(settings: dict[str, Any], split_data: Any, split_name: str,
                  tag: str | None, lengths: dict[str, int]) -> tuple[float, float]:
        """HTP and vanilla-mean (cached per exit layer) NDCG@10 on one split."""
        enc = HTPEncoder(model, "htp", **settings, **{**FIXED_LENGTH, **lengths})
        if (tag, enc.exit_layer) not in vanilla_at:
            van = HTPEncoder(model, "vanilla-mean", output_layer=settings["output_layer"],
                             **{**FIXED_LENGTH, **lengths})
            ndcg = run_retrieval(van, split_data, split=split_name,
                                 show_progress_bar=False).scores["NDCG@10"]
            vanilla_at[tag, enc.exit_layer] = ndcg
            if journal is not None:
                journal.add_vanilla(tag, enc.exit_layer, ndcg)
        htp = run_retrieval(enc, split_data, split=split_name,
                            show_progress_bar=False).scores["NDCG@10"]
        return htp, vanilla_at[tag, enc.exit_layer]

    def score(settings: dict[str, Any], *, long: bool = False) -> Trial:
        nonlocal replayed
        key = TrialJournal.key(settings, long)
        if key in done:
            return done[key]
        if journal is not None and key in journal.trials:
            trial = journal.trials[key]
            replayed += trial.seconds
            trials.append(trial)
            done[key] = trial
            print(f"[calibrate, from {journal.path.name}] {settings} htp {trial.htp:.2f} "
                  f"vanilla {trial.vanilla:.2f} gain {trial.gain:+.2f}", file=log, flush=True)
            return trial
        t0 = time.perf_counter()
        parts = None
        if long:
            parts = {ls.name: list(ndcg_pair(settings, ls.data, "test", ls.name,
                                             {"max_length": long_lengths[ls.name]}))
                     for ls in long_sets}
            htp = sum(h for h, _ in parts.values()) / len(parts)
            van = sum(v for _, v in parts.values()) / len(parts)
        else:
            htp, van = ndcg_pair(settings, data, split, None, {})
        trial = Trial(dict(settings), htp, van, time.perf_counter() - t0, long=long,
                      parts=parts)
        trials.append(trial)
        done[key] = trial
        if journal is not None:
            journal.add_trial(trial)
        where = f" on {', '.join(parts)}" if parts else ""
        print(f"[calibrate{where}] {settings} htp {htp:.2f} vanilla {van:.2f} "
              f"gain {trial.gain:+.2f} ({trial.seconds:.0f} s)", file=log, flush=True)
        return trial

    best_long: Trial | None = None
    if long_sets:  # first, so the main search cannot use up the budget it needs
        for lb in LONG_BUDGETS:
            if best_long is not None and spent() > budget_seconds:
                break
            t = score({**cur, "long_budget": lb}, long=True)
            if best_long is None or t.objective(min_gain) > best_long.objective(min_gain):
                best_long = t
        cur["long_budget"] = best_long.settings["long_budget"]  # type: ignore[union-attr]
    best = score(cur)
    axes = candidate_axes(n_layers)
    for _ in range(rounds):
        improved = False
        for axis, values in axes.items():
            for v in values:
                if spent() > budget_seconds:
                    break
                cand = dict(cur)
                if axis == "window":
                    cand["tp_start"], cand["tp_exit"] = v
                else:
                    cand[axis] = v
                t = score(cand)
                if t.objective(min_gain) > best.objective(min_gain):
                    best, cur, improved = t, cand, True
        if not improved or spent() > budget_seconds:
            break
    chosen = dict(best.settings)
    return Calibration(
        model=model,
        n_layers=n_layers,
        best=chosen,
        best_gain=round(best.gain, 3),
        min_gain=min_gain,
        trials=[{**asdict(t), "gain": round(t.gain, 3)} for t in trials],
        data={"name": data.name, "split": split, "n_queries": len(data.queries),
              "n_docs": len(data.corpus)},
        budget_seconds=budget_seconds,
        long_data=[{"name": ls.name, "max_length": ls.max_length,
                    "n_queries": len(ls.data.queries), "n_docs": len(ls.data.corpus)}
                   for ls in long_sets] or None,
        best_long_gain=None if best_long is None else round(best_long.gain, 3),
    )


def parse_long_data(text: str) -> list[tuple[str, int]]:
    """Parse ``--long-data``: ``needle:2048``, ``needle:2048,8192`` or
    ``needle:2048,passkey:4096`` (a bare length takes the task before it).

    Returns:
        ``[(task, context length in tokens), ...]``.

    Raises:
        SystemExit: naming the value, if an item is not a synthetic task with a positive
            length.
    """
    from htp_retrieval.eval.synthetic import parse_synthetic_spec

    out: list[tuple[str, int]] = []
    for item in (x.strip() for x in text.split(",")):
        if item.isdigit() and out:
            item = f"{out[-1][0]}:{item}"
        try:
            spec = parse_synthetic_spec(item)
        except ValueError:
            spec = None
        if spec is None:
            raise SystemExit(f"--long-data {text!r}: expected needle:<tokens> or "
                             "passkey:<tokens> items, e.g. needle:2048,8192")
        out.append(spec)
    return out


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval calibrate``: the coordinate search of this module on a validation
    split, writing the preset JSON (refuses the test split unless ``--allow-test``)."""
    import torch

    from htp_retrieval.eval.data import load_beir, subsample

    if args.split == "test" and not args.allow_test:
        raise SystemExit("calibrating on the test split leaks into reported numbers; use a "
                         "train/dev split (or --allow-test to insist)")
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_beir(args.data, split=args.split)
    if args.max_queries or args.max_docs:
        data = subsample(data, n_queries=args.max_queries or None,
                         n_docs=args.max_docs or None, seed=args.seed)
    long_sets = []
    if args.long_data:
        from htp_retrieval.eval.harness import resolve_data

        specs = parse_long_data(args.long_data)
        if args.long_seed == 0 and not args.allow_test:
            raise SystemExit(f"--long-seed 0 generates the test data that `eval --data "
                             f"{specs[0][0]}` reports; use another seed (or --allow-test)")
        for task, length in specs:
            (item,) = resolve_data(task, seed=args.long_seed, context_lengths=[length])
            long_sets.append(LongSet(f"{task}-{length}-seed{args.long_seed}", item.data,
                                     length))
    out = Path(args.output) if args.output else Path(
        "presets") / f"{args.model.replace('/', '__')}.json"
    journal_path = Path(args.journal) if args.journal else out.with_suffix(".trials.jsonl")
    try:
        journal = TrialJournal(journal_path,
                               journal_header(args.model, data, args.split, long_sets),
                               fresh=args.fresh)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if journal.trials:
        print(f"[calibrate] resuming: {len(journal.trials)} scored trials in {journal_path}",
              file=sys.stderr)
    cal = calibrate(args.model, data, split=args.split,
                    budget_seconds=args.budget_minutes * 60, rounds=args.rounds,
                    long_sets=long_sets, min_gain=args.min_gain, journal=journal)
    cal.command = "htp-retrieval " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    cal.save(out)
    print("| trial | data | settings | HTP | vanilla-mean | gain |\n|---|---|---|---|---|---|")
    for i, t in enumerate(cal.trials):
        where = ", ".join(t["parts"]) if t["long"] else cal.data["name"]
        print(f"| {i} | {where} | `{json.dumps(t['settings'], sort_keys=True)}` "
              f"| {t['htp']:.2f} | {t['vanilla']:.2f} | {t['gain']:+.2f} |")
    print(f"best: {cal.best} (gain {cal.best_gain:+.2f}) -> {out}", file=sys.stderr)
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register ``htp-retrieval calibrate``."""
    p = sub.add_parser("calibrate", help="choose HTP layers, exit and K policy for a model")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", default="../shared/data/beir/scifact")
    p.add_argument("--split", default="train", help="validation split (never test)")
    p.add_argument("--max-queries", type=int, default=100)
    p.add_argument("--max-docs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-minutes", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--output", default=None, help="preset JSON (default presets/<model>.json)")
    p.add_argument("--long-data", default=None,
                   help="needle:<tokens> or passkey:<tokens> (comma list, e.g. "
                   "needle:2048,8192): long documents for the long-text budget axis, "
                   "scored as the mean gain over them (searched first, at the family preset's layers; default: not searched)")
    p.add_argument("--long-seed", type=int, default=1,
                   help="generation seed of --long-data (0 is the test data; default 1)")
    p.add_argument("--min-gain", type=float, default=1.0,
                   help="NDCG@10 points over vanilla-mean (same exit layer) a candidate needs "
                   "before its own NDCG@10 decides; below it, the larger gain wins (default 1.0)")
    p.add_argument("--journal", default=None,
                   help="trial journal (JSON lines; default <output>.trials.jsonl): scored "
                   "trials are appended as they finish, and a rerun with the same model and "
                   "data reuses them, so an interrupted calibration resumes and a larger "
                   "budget extends one")
    p.add_argument("--fresh", action="store_true",
                   help="discard an existing journal and score every trial again")
    p.add_argument("--allow-test", action="store_true")
    p.set_defaults(func=cmd_calibrate)
