"""Sparse term vectors of text, deterministic: the tokenizer and the
BM25-style weights Vectide's sparse benchmarks and examples use.

- Words are runs of letters and digits, lower-cased (the same words as
  Qdrant's default word tokenizer and Vectide's ``match: text`` filter).
- :class:`Bm25` leaves out English stop words (:data:`ENGLISH_STOPWORDS`:
  articles, pronouns, auxiliary verbs, prepositions, conjunctions and a
  few adverbs, 137 words) from documents and queries alike, as the
  English analysers of full-text engines do: the commonest match most
  documents (``the`` is in 91 % of the benchmark's passages), add little to
  the ranking and most of the cost (91 % of the postings a whole-passage
  query touches). ``Bm25(stopwords=())`` keeps every word. A document's
  length is its number of words kept.
- A word's index is the FNV-1a 32-bit hash of its UTF-8 bytes: the same
  in every process and on every machine (Python's own ``hash`` is salted),
  with no vocabulary to ship. Two words that collide share an index.
- A document's weight for a word is BM25's saturated term frequency,
  ``tf · (k1 + 1) / (tf + k1 · (1 − b + b · len / avglen))`` (``k1`` 1.2,
  ``b`` 0.75, ``avglen`` from :meth:`Bm25.fit`); a query's weight for each
  of its words is 1. The inverse document frequency is the collection's
  side: a sparse space created with ``{"modifier": "idf"}`` multiplies each
  query weight by Qdrant's IDF of the word over the live points, so that
  the dot product is the BM25 score (up to collisions).

``Bm25().fit(texts).document(text)`` → ``{"indices": [...], "values":
[...]}``; ``.query(text)`` likewise.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Dict, Iterable, List

__all__ = ["words", "term_index", "Bm25", "ENGLISH_STOPWORDS"]

_WORD = re.compile(r"[^\W_]+")
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193

#: Function words left out of BM25 vectors by default (see the module docs).
ENGLISH_STOPWORDS = frozenset("""
a an the
i me my mine myself we us our ours ourselves you your yours yourself yourselves
he him his himself she her hers herself it its itself they them their theirs themselves
this that these those who whom whose which what
am is are was were be been being have has had having do does did doing
will would shall should can could may might must
and but or nor if then else so than as because while until although though
of at by for with about against between into through during before after
above below to from up down in out on off over under again further once
here there when where why how all any both each few more most other some such
no not only own same too very just s t
""".split())


def words(text: str) -> List[str]:
    """The words of ``text``: runs of letters and digits, lower-cased."""
    return [w.lower() for w in _WORD.findall(text)]


def term_index(word: str) -> int:
    """A word's index: FNV-1a (32 bits) of its UTF-8 bytes."""
    h = _FNV_OFFSET
    for byte in word.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _vector(weights: Dict[int, float]) -> Dict[str, list]:
    idx = sorted(weights)
    return {"indices": idx, "values": [float(weights[i]) for i in idx]}


class Bm25:
    """BM25-style sparse vectors (see the module docs)."""

    def __init__(self, k1: float = 1.2, b: float = 0.75, stopwords: Iterable[str] = ENGLISH_STOPWORDS) -> None:
        if not k1 >= 0 or not 0 <= b <= 1:
            raise ValueError(f"k1 must be >= 0 and b in [0, 1], got k1={k1}, b={b}")
        if isinstance(stopwords, str):
            raise TypeError("stopwords must be a collection of words, not one string")
        self.k1 = k1
        self.b = b
        self.stopwords = frozenset(w.lower() for w in stopwords)
        self.avglen = 1.0

    def terms(self, text: str) -> List[str]:
        """The words of ``text`` this encoder keeps (its stop words left out)."""
        return [w for w in words(text) if w not in self.stopwords]

    def fit(self, texts: Iterable[str]) -> "Bm25":
        """Learns the average document length (in words) of ``texts``."""
        n = total = 0
        for t in texts:
            n += 1
            total += len(self.terms(t))
        self.avglen = total / n if n and total else 1.0
        return self

    def document(self, text: str) -> Dict[str, list]:
        """A document's sparse vector: saturated term frequencies by index
        (colliding words add their frequencies)."""
        ws = self.terms(text)
        tf = Counter(term_index(w) for w in ws)
        norm = self.k1 * (1 - self.b + self.b * len(ws) / self.avglen)
        return _vector({i: f * (self.k1 + 1) / (f + norm) for i, f in tf.items()})

    def query(self, text: str) -> Dict[str, list]:
        """A query's sparse vector: weight 1 per distinct word (the IDF
        modifier of the collection's sparse space weighs them)."""
        return _vector({term_index(w): 1.0 for w in set(self.terms(text))})
