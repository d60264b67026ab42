"""The acknowledged history of a torture run, and the check against it.

Writers serialise operations per id (one lock per id), so the state of an id
is exactly the effect of its last acknowledged operation, except where an
operation on it was in flight when the process died: then either the state
before it or after it is correct, and the one found becomes the truth (with
several in flight on one id, any subset of them applied in the order they
began: see `Oracle.crashed`).
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

# The state of an id: None (absent) or (vector seed, payload seed).
State = Optional[Tuple[int, int]]

UPSERT, DELETE, SET_PAYLOAD = "u", "d", "p"


def vector(seed: int, dim: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


def payload(seed: int) -> dict:
    """A payload whose floats need every bit to compare equal."""
    rng = np.random.default_rng(seed + 7_919)
    return {
        "s": seed,
        "f": float(rng.standard_normal() * 10 ** int(rng.integers(-8, 9))),
        "tags": [f"t{seed % 7}", "x"],
        "n": {"big": int(rng.integers(0, 2**62)), "neg": -float(rng.random())},
    }


def after(state: State, kind: str, seed: int) -> State:
    if kind == UPSERT:
        return (seed, seed)
    if kind == DELETE:
        return None
    if kind == SET_PAYLOAD:
        return None if state is None else (state[0], seed)
    raise ValueError(kind)


class Oracle:
    """Expected state per id, and the operations in flight per writer."""

    def __init__(self, n_ids: int) -> None:
        self.expected: Dict[int, State] = {i: None for i in range(n_ids)}
        self.inflight: Dict[int, Tuple[int, str, int]] = {}
        self.uncertain: Dict[int, List[State]] = {}
        self.acked = 0
        self.lock = threading.Lock()

    def begin(self, writer: int, id_: int, kind: str, seed: int) -> None:
        with self.lock:
            self.inflight[writer] = (id_, kind, seed)

    def ack(self, writer: int) -> None:
        with self.lock:
            id_, kind, seed = self.inflight.pop(writer)
            self.expected[id_] = after(self.expected[id_], kind, seed)
            self.acked += 1

    def crashed(self) -> None:
        """The process died: what was in flight may or may not have happened.

        One id can have several operations in flight: when a writer's
        request fails at the kill, it releases the id's lock, and a writer
        waiting for that lock sends its own before it learns that the
        server is gone. The lock orders them, so they are composed in the
        order they began (the order of `inflight`, which keeps insertion
        order): each may or may not have happened after the ones before it.
        """
        with self.lock:
            for id_, kind, seed in self.inflight.values():
                states = self.uncertain.get(id_, [self.expected[id_]])
                for s in [after(s, kind, seed) for s in states]:
                    if s not in states:
                        states.append(s)
                self.uncertain[id_] = states
            self.inflight.clear()

    def check(self, found: Dict[int, State], dim: int) -> List[str]:
        """Compares the states found after recovery; returns the violations
        and adopts the outcome of each in-flight operation."""
        bad = []
        for id_, want in self.expected.items():
            got = found.get(id_)
            allowed = self.uncertain.get(id_, [want])
            if got not in allowed:
                bad.append(f"id {id_}: found {describe(got)}, acknowledged {' or '.join(describe(a) for a in allowed)}")
            else:
                self.expected[id_] = got
        self.uncertain.clear()
        return bad


def describe(s: State) -> str:
    return "absent" if s is None else f"vector#{s[0]}/payload#{s[1]}"


def identify(vec: Optional[np.ndarray], pay: Optional[dict], candidates: List[State], dim: int) -> State:
    """Which candidate state a stored (vector, payload) is. When it is none of
    them, a state that never is a candidate, saying what was found: each
    part's seed when the part is exactly the one some seed makes (a
    candidate's, or for the payload the seed it names, and for the vector
    the payload's seed: an older write), else -1."""
    if vec is None:
        return None
    v = np.asarray(vec, dtype=np.float32)
    for c in candidates:
        if c is None:
            continue
        if np.array_equal(v, vector(c[0], dim)) and (pay is None or pay == payload(c[1])):
            return c
    named = pay.get("s") if isinstance(pay, dict) else None
    ok = isinstance(named, int) and not isinstance(named, bool) and 0 <= named < 2**63
    p_seed = named if ok and pay == payload(named) else -1
    seeds = [c[0] for c in candidates if c is not None] + ([p_seed] if p_seed >= 0 else [])
    v_seed = next((s for s in seeds if np.array_equal(v, vector(s, dim))), -1)
    if pay is None and v_seed >= 0:
        p_seed = -1  # the vector of a state whose payload was not read
    # Never a candidate: a pair of seeds that is one matched above.
    return (v_seed, p_seed)
