"""Method presets: HTP and its baselines, with the official repo's CLI names as aliases.

Each method is a :class:`MethodSpec`: a prompt template, a placeholder scheme, a block
rule and a pooling mode. The layout builder (:mod:`htp_retrieval.layout`) and the rewiring
(:mod:`htp_retrieval.rewiring`) read nothing but this spec.

Sources:
    * vanilla mean / last-token pooling: plain decoder embeddings.
    * Echo (Springer et al., 2024): text repeated, mean pooling over the second copy.
    * PromptEOL (Jiang et al., 2023): ``This sentence : "X" means in one word:"``, last token.
    * Token Prepending (Fu et al., ACL 2025): one ``<PST>`` before the text fed the last
      token's state before each layer in [tp_start, tp_exit).
    * HTP (Ding et al., ACL 2026, Sec. 4, Eq. 3): ``<B-PST>_1..M <PST>_1 S_1 .. <PST>_M S_M``,
      local copy (Sec. 4.2) then global copy (Sec. 4.3), early exit and mean pooling (Sec. 4.4).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Template = Literal["plain", "prompteol", "echo"]
"""Prompt template around the text."""
PlaceholderScheme = Literal["none", "tp", "local", "hierarchical"]
"""``none``: no placeholders; ``tp``: one ``<PST>`` (Token Prepending); ``local``: a ``<PST>``
before each block (local prepending only); ``hierarchical``: ``<PST>`` per block plus the
``<B-PST>`` block (HTP)."""
BlockRule = Literal["sentence", "tokens"]
"""How blocks are cut: every K sentences, or every N tokens (the paper's Fig. 7 ablation)."""
PoolingMode = Literal["mean", "last"]
"""Mean pooling over text tokens, or last-token pooling."""
TokensPerBlock = int | Literal["auto"]
"""N for fixed-token blocks: a count, or ``"auto"``: per document, N = text tokens // sentence
blocks, so the ``<PST>`` count matches the sentence version (the paper's Fig. 7 ablation)."""


@dataclass(frozen=True)
class MethodSpec:
    """A named embedding method.

    Attributes:
        name: Canonical name (``htp``, ``vanilla-mean``, ...).
        template: Prompt template (:data:`Template`).
        placeholders: Placeholder scheme (:data:`PlaceholderScheme`).
        pooling: Readout (:data:`PoolingMode`).
        blocks: Block rule for ``local``/``hierarchical`` schemes (:data:`BlockRule`).
        sentences_per_block: K, sentences per block (paper Sec. 4.1; default 1).
        tokens_per_block: N, tokens per block when ``blocks == "tokens"``
            (:data:`TokensPerBlock`; ``"auto"`` picks N per document).
        summary: What each ``<PST>`` receives before a copy layer: ``last``, the state of
            its block's last token (the paper, Sec. 4.2), or ``mean``, the mean of its
            block's token states.
        max_blocks: Adaptive K budget (:func:`htp_retrieval.layout.adaptive_k`): at most
            this many blocks per document, K growing to ``ceil(sentences / max_blocks)``
            on longer documents (the paper's Table 12 favours larger K for long documents,
            Sec. 5.3); ``None`` keeps K fixed.
        min_block_tokens: Adaptive K's density cap T: at most one block per T text tokens;
            ``None``: no cap.
        long_budget: ``(L, B_L)``: past L text tokens a document gets at most B_L blocks;
            ``None``: no such budget. A model family's preset may set its own in place of
            it (:attr:`htp_retrieval.models.LayerPreset.long_budget`).
        description: One line for the README's method table.

    How ``htp``'s values (``mean``, 32, 64, ``(1024, 8)``) were chosen: docs/METHODS.md and
    research/ANALYSIS.md (sections 8-13).
    """

    name: str
    template: Template
    placeholders: PlaceholderScheme
    pooling: PoolingMode
    blocks: BlockRule = "sentence"
    sentences_per_block: int = 1
    tokens_per_block: TokensPerBlock = 32
    summary: Literal["last", "mean"] = "last"
    max_blocks: int | None = None
    min_block_tokens: int | None = None
    long_budget: tuple[int, int] | None = None
    description: str = ""

    @property
    def uses_rewiring(self) -> bool:
        """Whether the method installs copy hooks (any placeholder scheme but ``none``)."""
        return self.placeholders != "none"

    def with_options(
        self, *, k: int | None = None, tokens_per_block: TokensPerBlock | None = None
    ) -> MethodSpec:
        """Return a copy with K and/or N overridden (``None`` keeps the preset).

        Raises:
            ValueError: if K or N is below 1, or N is neither an int nor ``"auto"``.
        """
        if k is not None and k < 1:
            raise ValueError(f"k (sentences per block) must be >= 1, got {k}")
        if tokens_per_block is not None and tokens_per_block != "auto" and (
            not isinstance(tokens_per_block, int) or tokens_per_block < 1
        ):
            raise ValueError(f"tokens_per_block must be >= 1 or 'auto', got {tokens_per_block!r}")
        return replace(
            self,
            sentences_per_block=k if k is not None else self.sentences_per_block,
            tokens_per_block=(
                tokens_per_block if tokens_per_block is not None else self.tokens_per_block
            ),
        )


METHODS: dict[str, MethodSpec] = {
    m.name: m
    for m in [
        MethodSpec("vanilla-mean", "plain", "none", "mean",
                   description="Plain input, mean pooling over text tokens."),
        MethodSpec("vanilla-last", "plain", "none", "last",
                   description="Plain input, last-token pooling."),
        MethodSpec("echo-mean", "echo", "none", "mean",
                   description="Echo: text repeated, mean pooling over the second copy."),
        MethodSpec("prompteol-last", "prompteol", "none", "last",
                   description='PromptEOL template, last-token pooling.'),
        MethodSpec("tp-prompteol-last", "prompteol", "tp", "last",
                   description="Token Prepending: one <PST> fed the last token's state; "
                   "PromptEOL, last-token pooling."),
        MethodSpec("tp-mean", "plain", "tp", "mean",
                   description="Token Prepending with mean pooling over text tokens."),
        MethodSpec("tp-sentence", "plain", "local", "mean",
                   description="A <PST> before each block of K sentences (local prepending "
                   "only), mean pooling."),
        MethodSpec("htp", "plain", "hierarchical", "mean", summary="mean", max_blocks=32,
                   min_block_tokens=64, long_budget=(1024, 8),
                   description="HTP: <PST> and <B-PST> per block of K sentences fed the "
                   "block's mean state (local + global), at most 32 blocks, one block per "
                   "64 text tokens and 8 blocks past 1024 text tokens per document "
                   "(adaptive K), early exit, mean pooling."),
        MethodSpec("htp-last", "plain", "hierarchical", "mean", summary="last",
                   description="HTP exactly as the paper: <PST>/<B-PST> fed the block's "
                   "last-token state."),
        MethodSpec("htp-fixed-tokens", "plain", "hierarchical", "mean", blocks="tokens",
                   summary="mean",
                   description="HTP with blocks of N tokens instead of sentences "
                   "(the paper's Fig. 7 ablation)."),
    ]
}

ALIASES: dict[str, str] = {
    # official HTP repo --model_method names
    "vanilla-mean-pool": "vanilla-mean",
    "vanilla-last-pool": "vanilla-last",
    "echo-mean-pool": "echo-mean",
    "prompteol-last-pool": "prompteol-last",
    "tp-mean-pool": "tp-mean",
    "tp-prompteol-last-pool": "tp-prompteol-last",
    # official --use_which_plan names (with mean pooling, as the README runs them)
    "vanilla": "vanilla-mean",
    "tp": "tp-mean",
    "tp_sentence": "tp-sentence",
    "tp_sentence_begin": "htp-last",  # the official plan feeds last-token states
    "fixed-token": "htp-fixed-tokens",
    # task presets, chosen by measurement (research/ANALYSIS.md, section 9; docs/RESULTS.md STS-B)
    "retrieval": "htp",  # HTP on both queries and documents
    "sts": "prompteol-last",  # short-text similarity: PromptEOL beat HTP on STS-B
}


def get_method(name: str | MethodSpec) -> MethodSpec:
    """Resolve a method name or alias to its :class:`MethodSpec`.

    Args:
        name: A canonical name, an alias from the official repo, or a spec (returned as is).

    Raises:
        ValueError: if the name is unknown; the message lists the valid names.
    """
    if isinstance(name, MethodSpec):
        return name
    key = ALIASES.get(name, name)
    if key not in METHODS:
        valid = ", ".join(sorted(METHODS) + sorted(ALIASES))
        raise ValueError(f"unknown method {name!r}; valid names: {valid}")
    return METHODS[key]


def plan_to_method(model_method: str, use_which_plan: str | None) -> MethodSpec:
    """Map the official repo's ``--model_method`` + ``--use_which_plan`` pair to a method.

    In the official scripts ``--use_which_plan tp_sentence``/``tp_sentence_begin`` turn a
    ``vanilla-mean-pool`` run into sentence TP / HTP; otherwise the model method decides.

    Raises:
        ValueError: for unknown names.
    """
    if use_which_plan in ("tp_sentence", "tp_sentence_begin"):
        return get_method(use_which_plan)
    return get_method(model_method)


# Table 6 of the paper (BEIR and LongEmbed instructions), applied to queries.
TASK_INSTRUCTIONS: dict[str, str] = {
    "arguana": "Given a claim, retrieve documents that support or refute the claim",
    "fiqa": "Given a financial question, retrieve user replies that best answer the question",
    "fiqa2018": "Given a financial question, retrieve user replies that best answer the question",
    "hotpotqa": "Given a multi-hop question, retrieve documents that can help answer the question",
    "nfcorpus": "Given a question, retrieve relevant documents that answer the question",
    "scidocs": "Given a scientific paper title, retrieve paper abstracts that are cited by the "
    "given paper",
    "scifact": "Given a scientific claim, retrieve documents that support or refute the claim",
    "trec-covid": "Given a query on COVID-19, retrieve documents that answer the query",
    "narrativeqa": "Retrieve the relevant document",
    "qmsum": "Retrieve the relevant document",
    "2wikimqa": "Retrieve the relevant document",
    "summ_screen_fd": "Retrieve the relevant document",
    "needle": "Retrieve the relevant document",
    "passkey": "Retrieve the relevant document",
}
DEFAULT_QUERY_INSTRUCTION = "Retrieve the relevant document"


def task_instructions(task: str) -> tuple[str | None, str | None]:
    """Return ``(query_instruction, document_instruction)`` for a task name.

    Queries get the paper's Table 6 wording (unknown tasks: ``"Retrieve the relevant
    document"``); documents get no instruction, as in the paper's retrieval setup.
    """
    return TASK_INSTRUCTIONS.get(task.lower(), DEFAULT_QUERY_INSTRUCTION), None
