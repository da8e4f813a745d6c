"""RAG over Paul Graham essays: LangChain + Chroma + HTPEmbeddings + the packaged SmolLM2.

Ingests the essays (split into paragraph chunks) into a Chroma collection through
``langchain-chroma`` with :class:`~htp_retrieval.integrations.HTPEmbeddings`, retrieves for a
question, and answers it with SmolLM2-135M-Instruct through a small LangChain chat model
over ``transformers`` generation. Runs offline.

Usage:
    python examples/langchain_rag.py [ESSAYS_DIR] [--limit 5] [--question "..."]
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


def chunk_essays(folder: Path, limit: int | None, chunk_chars: int
                 ) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """Split essays into paragraph chunks of about ``chunk_chars`` characters.

    Returns:
        ``(texts, metadatas, ids)``, ids ``"<essay>#<n>"`` (stable across runs).
    """
    files = sorted(folder.glob("*.txt"))[: limit or None]
    if not files:
        raise FileNotFoundError(f"no .txt essays in {folder}")
    texts, metas, ids = [], [], []
    for f in files:
        paras = [p.strip() for p in f.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        cur = ""
        chunks = []
        for p in paras:
            if cur and len(cur) + len(p) > chunk_chars:
                chunks.append(cur)
                cur = ""
            cur = f"{cur}\n\n{p}" if cur else p
        if cur:
            chunks.append(cur)
        for n, c in enumerate(chunks):
            texts.append(c)
            metas.append({"essay": f.stem})
            ids.append(f"{f.stem}#{n}")
    return texts, metas, ids


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
    p.add_argument("--chunk-chars", type=int, default=1500)
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args(argv)

    from langchain_chroma import Chroma
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.chroma import make_client

    texts, metas, ids = chunk_essays(Path(args.essays), args.limit, args.chunk_chars)
    db = args.db or tempfile.mkdtemp(prefix="htp-lc-chroma-")
    # One-line swap: HuggingFaceEmbeddings(...) -> HTPEmbeddings(...)
    embeddings = HTPEmbeddings(
        query_instruction="Given a question, retrieve passages that answer the question",
        show_progress=True,
    )
    store = Chroma(collection_name=args.collection, embedding_function=embeddings,
                   client=make_client(db))
    store.add_texts(texts, metadatas=metas, ids=ids)  # stable ids: re-runs upsert
    print(f"indexed {len(texts)} chunks from {len(set(m['essay'] for m in metas))} essays "
          f"in {db}")
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
        print(f"source: {d.metadata.get('essay')}: {d.page_content[:80]!r}")
    answer = chain.invoke(args.question)
    print(f"question: {args.question}\nanswer: {answer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
