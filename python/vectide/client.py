"""``vectide.Client(url, api_key=None)``: the database surface over HTTP.

The same methods as :mod:`vectide.db` (``create_collection``,
``get_collection``, ``list_collections``, ``delete_collection``; on a
collection ``upsert``, ``search``, ``search_numpy``, ``get``, ``delete``,
``count``, ``scroll``, ``set_payload``, ``query``, ``query_groups``,
``create_index``, ``maintain``, ``checkpoint``), talking to
``vectide serve`` through its REST API (the Qdrant-shaped subset), with the
standard library's ``http.client`` only. Each thread keeps one persistent
(keep-alive) connection; a request that finds its reused connection closed
by the server is sent once more on a new one.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from typing import Any, Dict, List, Optional

import numpy as np

from ._convert import (_check_params, _dumps, _groups_body, _id_value, _id_values, _int, _point_dicts, _query_body, _rows,
                       _spaces)
from .db import Group, Hit, Point

_DISTANCE = {"cosine": "Cosine", "ip": "Dot", "l2": "Euclid"}
_METRIC = {v: k for k, v in _DISTANCE.items()}


class ServerError(RuntimeError):
    """An error answer of the server (``status`` holds the HTTP status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _id_list(ids) -> List[Any]:
    return _id_values(ids)


def _finite_rows(vectors) -> np.ndarray:
    rows = _rows(vectors)
    bad = np.argwhere(~np.isfinite(rows))
    if len(bad):
        r, c = bad[0]
        raise ValueError(f"vector {r}: non-finite value {rows[r, c]} at position {c}")
    return rows


class Client:
    """A connection to ``vectide serve`` (see the module docs)."""

    def __init__(self, url: str = "http://127.0.0.1:6333", api_key: Optional[str] = None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        u = urllib.parse.urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self) -> "tuple[http.client.HTTPConnection, bool]":
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        self._local.conn = conn
        return conn, False

    def close(self) -> None:
        """Closes this thread's connection (a new one opens on demand)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = None if body is None else _dumps(body, "request").encode()
        headers = {"content-type": "application/json"}
        if self.api_key is not None:
            headers["api-key"] = self.api_key
        for attempt in (0, 1):
            conn, reused = self._connection()
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                r = conn.getresponse()
                raw = r.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if not reused or attempt == 1:
                    raise
            except BaseException:
                self.close()
                raise
        if r.will_close:
            self.close()
        if r.status >= 400:
            try:
                msg = json.loads(raw)["status"]["error"]
            except (ValueError, KeyError, TypeError):
                msg = raw.decode(errors="replace")
            if r.status == 404 and "not found" in msg:
                raise KeyError(msg) from None
            if r.status in (400, 409, 413):
                raise ValueError(msg) from None
            if r.status == 503 and msg.startswith("poisoned:"):
                # The embedded collection's exception, as the protocol wants.
                from ._vectide import PoisonedError

                raise PoisonedError(msg) from None
            raise ServerError(r.status, msg) from None
        doc = json.loads(raw or b"null")
        return doc.get("result") if isinstance(doc, dict) and "result" in doc else doc

    def create_collection(self, name: str, dim: Optional[int] = None, metric: str = "cosine", engine: Optional[str] = None, *,
                          vectors: Optional[Dict[str, Dict[str, Any]]] = None, sparse_vectors: Optional[Dict[str, Any]] = None,
                          **params) -> "RemoteCollection":
        """``engine``: one the server's registry knows (its default when None).
        Named and sparse vectors as the embedded ``create_collection`` takes
        them (``vectors={"NAME": {"dim", "metric", "engine", "params"}}``,
        ``sparse_vectors={"NAME": {"modifier": "idf"} or None}``)."""
        if vectors is not None or sparse_vectors is not None:
            if dim is not None or engine is not None or params:
                raise TypeError("with vectors / sparse_vectors, give each space's dim, engine and params there")
            dense, sparse = _spaces(vectors, sparse_vectors)
            body: Dict[str, Any] = {"vectors": {}, "vectide": {"vectors": {}}}
            for n, d, m, e, p in dense:
                if m not in _DISTANCE:
                    raise ValueError(f"vectors[{n!r}].metric must be one of {sorted(_DISTANCE)}, got {m!r}")
                body["vectors"][n] = {"size": _int(d, f"vectors[{n!r}].dim"), "distance": _DISTANCE[m]}
                own: Dict[str, Any] = {"params": p}
                if e is not None:
                    own["engine"] = e
                body["vectide"]["vectors"][n] = own
            if sparse:
                body["sparse_vectors"] = {n: {"modifier": m} for n, m in sparse}
            self._call("PUT", f"/collections/{name}", body)
            return RemoteCollection(self, name)
        if dim is None:
            raise TypeError("create_collection needs dim (or vectors / sparse_vectors)")
        if metric not in _DISTANCE:
            raise ValueError(f"metric must be one of {sorted(_DISTANCE)}, got {metric!r}")
        dim = _int(dim, "dim")
        vectide: Dict[str, Any] = {"params": _check_params(params)}
        if engine is not None:
            vectide["engine"] = engine
        self._call("PUT", f"/collections/{name}", {
            "vectors": {"size": dim, "distance": _DISTANCE[metric]},
            "vectide": vectide,
        })
        return RemoteCollection(self, name)

    def get_collection(self, name: str) -> "RemoteCollection":
        if not self._call("GET", f"/collections/{name}/exists")["exists"]:
            raise KeyError(f"collection {name!r} not found")
        return RemoteCollection(self, name)

    def list_collections(self) -> List[str]:
        return sorted(c["name"] for c in self._call("GET", "/collections")["collections"])

    def delete_collection(self, name: str) -> bool:
        return bool(self._call("DELETE", f"/collections/{name}"))


def _vector(v):
    """A point's vector as the embedded collection gives it: a float32
    array, or ``{"NAME": array | {"indices", "values"}}``."""
    if v is None:
        return None
    if isinstance(v, dict):
        return {k: x if isinstance(x, dict) else np.asarray(x, dtype=np.float32) for k, x in v.items()}
    return np.asarray(v, dtype=np.float32)


def _hit(metric: str, h: Dict[str, Any]) -> Hit:
    s = float(h["score"])
    d = {"cosine": 1.0 - s, "ip": -s, "l2": s * s}[metric]
    return Hit(h["id"], s, d, h.get("payload"), h.get("vector"))


class RemoteCollection:
    """A collection behind a :class:`Client`."""

    def __init__(self, client: Client, name: str) -> None:
        self._c = client
        self.name = name
        self._metric: Optional[str] = None

    def _path(self, suffix: str = "") -> str:
        return f"/collections/{self.name}{suffix}"

    def info(self) -> Dict[str, Any]:
        return self._c._call("GET", self._path())

    @property
    def metric(self) -> str:
        if self._metric is None:
            self._metric = _METRIC[self.info()["config"]["params"]["vectors"]["distance"]]
        return self._metric

    def __len__(self) -> int:
        return self.count()

    def upsert(self, ids, vectors, payloads=None) -> int:
        ids = _id_list(ids)
        rows = _finite_rows(vectors)
        if len(ids) != len(rows):
            raise ValueError(f"got {len(ids)} ids but {len(rows)} vectors")
        payloads = list(payloads) if payloads is not None else [None] * len(ids)
        pts = [{"id": i, "vector": v.tolist(), "payload": p} for i, v, p in zip(ids, rows, payloads)]
        return self._c._call("PUT", self._path("/points?wait=true"), {"points": pts})["operation_id"]

    def search(self, vectors, k: int = 10, filter=None, with_payload: bool = True, with_vector: bool = False,
               ef: Optional[int] = None, exact: bool = False) -> List[List[Hit]]:
        """As the embedded ``Collection.search``; ``exact=True`` asks the
        server for an exact scan (Qdrant's ``params.exact``)."""
        k = _int(k, "k")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if ef is not None:
            ef = _int(ef, "ef")
        if filter is not None and not isinstance(filter, dict):
            raise TypeError(f"filter must be a dict, got {type(filter).__name__}")
        searches = []
        for q in _finite_rows(vectors):
            s: Dict[str, Any] = {"query": q.tolist(), "limit": k, "with_payload": with_payload, "with_vector": with_vector}
            if filter is not None:
                s["filter"] = filter
            params: Dict[str, Any] = {}
            if ef is not None:
                params["hnsw_ef"] = ef
            if exact:
                params["exact"] = True
            if params:
                s["params"] = params
            searches.append(s)
        res = self._c._call("POST", self._path("/points/query/batch"), {"searches": searches})
        m = self.metric
        return [[_hit(m, h) for h in r["points"]] for r in res]

    def search_numpy(self, vectors, k: int = 10, filter=None, ef: Optional[int] = None):
        res = self.search(vectors, k, filter, with_payload=False, ef=ef)
        numeric = all(isinstance(h.id, int) for q in res for h in q)
        ids = np.full((len(res), k), np.iinfo(np.uint64).max, dtype=np.uint64) if numeric else np.full((len(res), k), None, dtype=object)
        scores = np.full((len(res), k), np.nan, dtype=np.float32)
        for i, q in enumerate(res):
            for j, h in enumerate(q):
                ids[i, j] = h.id
                scores[i, j] = h.score
        return ids, scores

    def get(self, ids, with_vector: bool = True) -> List[Point]:
        want = _id_list(ids)
        recs = self._c._call("POST", self._path("/points"), {"ids": want, "with_payload": True, "with_vector": with_vector})
        by_id = {json.dumps(r["id"]): r for r in recs}
        missing = [i for i in want if json.dumps(i) not in by_id]
        if missing:
            raise KeyError(f"ids not found: {missing}")
        out = []
        for i in want:
            r = by_id[json.dumps(i)]
            out.append(Point(r["id"], r.get("payload") or {}, _vector(r.get("vector"))))
        return out

    def delete(self, ids=None, filter=None) -> int:
        if ids is None and filter is None:
            raise ValueError("delete needs ids or a filter")
        before = self.count()
        body = {"points": _id_list(ids)} if ids is not None else {"filter": filter}
        self._c._call("POST", self._path("/points/delete?wait=true"), body)
        return before - self.count()

    def count(self, filter=None) -> int:
        body: Dict[str, Any] = {"exact": True}
        if filter is not None:
            body["filter"] = filter
        return self._c._call("POST", self._path("/points/count"), body)["count"]

    def scroll(self, filter=None, offset=None, limit: int = 10, with_vector: bool = False):
        body: Dict[str, Any] = {"limit": _int(limit, "limit"), "with_payload": True, "with_vector": with_vector}
        if filter is not None:
            body["filter"] = filter
        if offset is not None:
            body["offset"] = _id_value(offset)
        r = self._c._call("POST", self._path("/points/scroll"), body)
        pts = [Point(p["id"], p.get("payload") or {}, _vector(p.get("vector"))) for p in r["points"]]
        return pts, r.get("next_page_offset")

    def upsert_points(self, points) -> int:
        """As the embedded ``upsert_points`` (named and sparse vectors)."""
        return self._c._call("PUT", self._path("/points?wait=true"), {"points": _point_dicts(points)})["operation_id"]

    def query(self, query=None, *, prefetch=None, using: Optional[str] = None, filter=None, limit: int = 10,
              offset: int = 0, score_threshold: Optional[float] = None, with_payload: bool = True,
              with_vector=False, params: Optional[Dict[str, Any]] = None) -> List[Hit]:
        """As the embedded ``Collection.query`` (the server's ``/points/query``)."""
        body = _query_body(query, prefetch, using, filter, limit, offset, score_threshold, with_payload, with_vector, params)
        res = self._c._call("POST", self._path("/points/query"), body)
        return [Hit(h["id"], float(h["score"]), float("nan"), h.get("payload"), h.get("vector")) for h in res["points"]]

    def query_groups(self, group_by: str, query=None, *, prefetch=None, using: Optional[str] = None, filter=None,
                     limit: int = 10, group_size: int = 3, score_threshold: Optional[float] = None,
                     with_payload: bool = True, with_vector=False, params: Optional[Dict[str, Any]] = None) -> List[Group]:
        """As the embedded ``Collection.query_groups`` (the server's
        ``/points/query/groups``)."""
        body = _groups_body(group_by, query, prefetch, using, filter, limit, group_size, score_threshold, with_payload,
                            with_vector, params)
        res = self._c._call("POST", self._path("/points/query/groups"), body)
        return [Group(g["id"], [Hit(h["id"], float(h["score"]), float("nan"), h.get("payload"), h.get("vector"))
                                for h in g["hits"]]) for g in res["groups"]]

    def _edit(self, method: str, suffix: str, body: Dict[str, Any], ids, filter) -> int:
        if ids is None and filter is None:
            raise ValueError("a payload edit needs ids or a filter")
        if ids is not None:
            body["points"] = _id_list(ids)
        if filter is not None:
            body["filter"] = filter
        if ids is None:
            n = self.count(filter)
        else:
            n = len(self._c._call("POST", self._path("/points"), {"ids": _id_list(ids), "with_payload": False}))
        self._c._call(method, self._path(suffix + "?wait=true"), body)
        return n

    def set_payload(self, payload: Dict[str, Any], ids=None, filter=None, key: Optional[str] = None) -> int:
        body: Dict[str, Any] = {"payload": payload}
        if key is not None:
            body["key"] = key
        return self._edit("POST", "/points/payload", body, ids, filter)

    def overwrite_payload(self, payload: Dict[str, Any], ids=None, filter=None) -> int:
        return self._edit("PUT", "/points/payload", {"payload": payload}, ids, filter)

    def delete_payload(self, keys, ids=None, filter=None) -> int:
        return self._edit("POST", "/points/payload/delete", {"keys": list(keys)}, ids, filter)

    def clear_payload(self, ids=None, filter=None) -> int:
        return self._edit("POST", "/points/payload/clear", {}, ids, filter)

    def create_index(self, field: str, schema: str = "keyword") -> None:
        self._c._call("PUT", self._path("/index?wait=true"), {"field_name": field, "field_schema": schema})

    def maintain(self) -> None:
        """Runs the engine's pending maintenance now (a delete
        consolidation, a merge, a rebuild) and returns once none is in
        flight; writes and searches go on (Vectide's own endpoint,
        ``POST /collections/{name}/vectide/maintain``)."""
        self._c._call("POST", self._path("/vectide/maintain"))

    def checkpoint(self) -> None:
        """A checkpoint now: the engine's state made durable and the commit
        log cut behind it (``POST /collections/{name}/vectide/checkpoint``)."""
        self._c._call("POST", self._path("/vectide/checkpoint"))
