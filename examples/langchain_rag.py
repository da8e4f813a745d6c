"""RAG over Paul Graham essays: LangChain + Chroma + chunked HTP vectors + SmolLM2.

Loads the essays as LangChain ``Document`` s, splits them into chunks of at most
``--chunk-tokens`` model tokens with a LangChain ``RecursiveCharacterTextSplitter``
(``add_start_index=True``; :func:`~htp_retrieval.integrations.late_chunking.token_splitter`),
embeds every chunk on its own (default) or, with ``--chunking late``, in the context of its
whole essay (late chunking, Günther et al. 2024, arXiv 2409.04701:
:func:`~htp_retrieval.integrations.late_chunking.add_late_chunked_documents`) into a ``langchain-chroma`` store, retrieves chunks for a question, answers it with
SmolLM2-135M-Instruct through a small LangChain chat model over ``transformers`` generation,
and shows the essay the best chunks come from
(:class:`~htp_retrieval.integrations.late_chunking.LateChunkParentRetriever`). Runs offline.

Usage:
    python examples/langchain_rag.py [ESSAYS_DIR] [--limit 5] [--chunk-tokens 512]
        [--question "..."]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS

DEFAULT_ESSAYS = Path(__file__).resolve().parents[1] / "../shared/data/haystack/paul_graham_essays"


class TransformersChat(BaseChatModel):
    """Minimal LangChain chat model over a ``transformers`` causal LM (greedy decoding).

    The model comes from :func:`htp_retrieval.load_model`, so it is the same in-process
    instance the embeddings use.
    """

    model_name: str = Field(default="smollm2-135m-instruct", description="load_model name.")
    """Packaged name, local directory or hub id for :func:`htp_retrieval.load_model`."""
    max_new_tokens: int = Field(default=48, gt=0, description="Tokens generated per answer.")
    """Tokens generated per answer."""

    @property
    def _llm_type(self) -> str:
        return "htp-transformers-chat"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        import torch

        from htp_retrieval import load_model

        model, tok = load_model(self.model_name)
        roles = {"human": "user", "ai": "assistant", "system": "system"}
        chat = [{"role": roles.get(m.type, "user"), "content": str(m.content)} for m in messages]
        enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False, repetition_penalty=1.2,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for s in stop or []:
            text = text.split(s)[0]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text.strip()))])


def load_essays(folder: Path, limit: int | None) -> list[Any]:
    """The essays as LangChain Documents (``id``: file stem, ``metadata["essay"]``).

    Raises:
        FileNotFoundError: if the folder holds no ``.txt`` file.
    """
    from langchain_core.documents import Document

    files = sorted(folder.glob("*.txt"))[: limit or None]
    if not files:
        raise FileNotFoundError(f"no .txt essays in {folder}: pass the essays folder")
    return [Document(page_content=f.read_text(encoding="utf-8"), id=f.stem,
                     metadata={"essay": f.stem}) for f in files]


def main(argv: list[str] | None = None) -> int:
    """Build the store, retrieve and answer; prints sources and the answer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("essays", nargs="?", default=str(DEFAULT_ESSAYS), help="folder of essays")
    p.add_argument("--limit", type=int, default=0, help="first N essays only (0: all)")
    p.add_argument("--question", default="Why do startups need to grow fast?")
    p.add_argument("--db", default=None, help="Chroma directory (default: a temp dir)")
    p.add_argument("--collection", default="pg-essays")
    p.add_argument("--k", type=int, default=2, help="chunks retrieved")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS,
                   help="model tokens per chunk")
    p.add_argument("--chunk-overlap", type=int, default=0, help="overlap in tokens")
    p.add_argument("--chunking", choices=["naive", "late"], default="naive",
                   help="naive: each chunk embedded alone (default; ahead on the QMSum "
                   "evidence spans, docs/RAG.md); late: contextual chunk vectors")
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args(argv)

    from langchain_chroma import Chroma
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_core.stores import InMemoryStore

    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.chroma import make_client
    from htp_retrieval.integrations.late_chunking import (
        LateChunkParentRetriever,
        add_late_chunked_documents,
        split_documents,
        token_splitter,
    )

    essays = load_essays(Path(args.essays), args.limit)
    db = args.db or tempfile.mkdtemp(prefix="htp-lc-chroma-")
    # One-line swap: HuggingFaceEmbeddings(...) -> HTPEmbeddings(...)
    embeddings = HTPEmbeddings(
        query_instruction="Given a question, retrieve passages that answer the question",
        show_progress=True,
    )
    store = Chroma(collection_name=args.collection, embedding_function=embeddings,
                   client=make_client(db))
    parents = InMemoryStore()  # whole essays, keyed by essay id
    splitter = token_splitter(embeddings, args.chunk_tokens, args.chunk_overlap)
    # ids "<essay>#c<n>" (as htp-retrieval ingest): re-runs replace an essay's chunks
    if args.chunking == "late":
        ids = add_late_chunked_documents(store, embeddings, essays, splitter=splitter,
                                         docstore=parents)
    else:
        split = split_documents(essays, splitter)  # ids, parent and offsets as the late path
        chunks = [c for _, cs in split for c in cs]
        ids = store.add_documents(chunks, ids=[c.id for c in chunks])
        parents.mset([(p.id, p) for p, _ in split])
    tok = embeddings.encoder.tokenizer
    stored = store.get(ids=ids, include=["documents"])["documents"]
    longest = max(len(tok(t, add_special_tokens=False).input_ids) for t in stored)
    how = "late chunking" if args.chunking == "late" else "naive chunks"
    print(f"indexed {len(ids)} chunks from {len(essays)} essays ({how}, at most "
          f"{longest} tokens per chunk) in {db}")
    retriever = store.as_retriever(search_kwargs={"k": args.k})

    def format_docs(docs: list[Any]) -> str:
        return "\n\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer the question in one or two sentences using only the context."),
        ("human", "Context:\n{context}\n\nQuestion: {question}"),
    ])
    llm = TransformersChat(max_new_tokens=args.max_new_tokens)
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | prompt | llm | StrOutputParser())
    for d in retriever.invoke(args.question):
        m = d.metadata
        print(f"source: {m['essay']}#{m['chunk_index']} [{m['start_index']}:{m['end_index']}]: "
              f"{d.page_content[:80]!r}")
    essay = LateChunkParentRetriever(vectorstore=store, docstore=parents, k=1).invoke(
        args.question)[0]
    print(f"essay: {essay.id} ({len(essay.page_content)} characters, matched chunks "
          f"{essay.metadata['matched_chunks'][:5]})")
    answer = chain.invoke(args.question)
    print(f"question: {args.question}\nanswer: {answer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
