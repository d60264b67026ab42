"""The memory node's surface of the bad-input matrix (``--surfaces memnode``).

Starts ``vectide memnode`` on 127.0.0.1 (a free port, 1 MiB, at most 8
connections, its regions in a backing file) with a canary region of known
bytes, and sends it frames that
our compute nodes never send (``docs/protocol-memnode.md``): lengths of 0,
beyond the limit and lying; unknown kinds and verbs; requests before the
HELLO, a wrong magic or version; lying counts; reads and FLUSHes beyond a
region, past 2**64, of unknown regions, or too large for a reply; unaligned atomics;
regions beyond the node's size, unnamed or with names that are not UTF-8;
frames cut short; more connections than allowed. Each case must get an
error reply, a failed completion or a closed connection, and nothing else:
the node stays up, answers a well-formed client at once, keeps its thread
count, and the canary region and the region list are unchanged.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..memnode import MemoryNode
from .badinput import ChildProcess

MAGIC = b"VTDXMEM\0"
VERSION = 3
SIZE = 1 << 20
MAX_CONNECTIONS = 8
CANARY = bytes(range(256)) * 4  # 1 KiB


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def hello(version: int = VERSION, magic: bytes = MAGIC) -> bytes:
    return frame(b"\x01" + magic + struct.pack("<I", version))


def name_bytes(name: bytes) -> bytes:
    return bytes([len(name)]) + name


def create(name: bytes, size: int) -> bytes:
    return frame(b"\x02" + name_bytes(name) + struct.pack("<Q", size))


def open_region(name: bytes) -> bytes:
    return frame(b"\x03" + name_bytes(name))


def post(wrs: List[bytes], count: Optional[int] = None) -> bytes:
    n = len(wrs) if count is None else count
    return frame(b"\x06" + struct.pack("<I", n) + b"".join(wrs))


def read_wr(region: int, offset: int, length: int) -> bytes:
    return struct.pack("<BIQI", 1, region, offset, length)


def write_wr(region: int, offset: int, data: bytes) -> bytes:
    return struct.pack("<BIQI", 2, region, offset, len(data)) + data


def cas_wr(region: int, offset: int, expect: int, new: int) -> bytes:
    return struct.pack("<BIQQQ", 3, region, offset, expect, new)


def flush_wr(region: int, offset: int, length: int) -> bytes:
    return struct.pack("<BIQQ", 5, region, offset, length)


def recv_exact(s: socket.socket, n: int) -> Optional[bytes]:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def recv_frame(s: socket.socket) -> Optional[bytes]:
    """A reply body, or None when the node closed the connection."""
    try:
        p = recv_exact(s, 4)
        if p is None:
            return None
        return recv_exact(s, struct.unpack("<I", p)[0])
    except (ConnectionResetError, BrokenPipeError):
        return None


class Node(ChildProcess):
    def __init__(self, cli: str, log: Path) -> None:
        self.cli, self.log = cli, log
        self.proc: Optional[subprocess.Popen] = None
        self.addr: Tuple[str, int] = ("127.0.0.1", 0)
        self.canary_id = 0

    def start(self) -> "Node":
        # Regions in a backing file (a fresh one each start), so that every
        # case also runs against the persistent store and FLUSH does work.
        backing = self.log.with_name("memnode.vtb")
        backing.unlink(missing_ok=True)
        self.node = MemoryNode(SIZE, self.cli, self.log,
                               ["--max-connections", str(MAX_CONNECTIONS), "--backing", str(backing)]).start()
        self.proc, self.addr = self.node.proc, self.node.addr
        s = self.connect()
        reply = self.call(s, create(b"canary", len(CANARY)))
        assert reply is not None and reply[:2] == b"\x00\x02", reply
        self.canary_id = struct.unpack("<I", reply[2:6])[0]
        assert self.call(s, post([write_wr(self.canary_id, 0, CANARY)])) is not None
        s.close()
        return self

    def connect(self, greet: bool = True) -> socket.socket:
        s = socket.create_connection(self.addr, timeout=15)
        if greet:
            r = self.call(s, hello())
            if r is None or r[:2] != b"\x00\x01":
                raise RuntimeError(f"HELLO refused: {r!r}")
        return s

    @staticmethod
    def call(s: socket.socket, data: bytes) -> Optional[bytes]:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return None
        return recv_frame(s)

    def state(self) -> str:
        """The canary's bytes and the region list, hashed (a good client)."""
        s = self.connect()
        data = self.call(s, post([read_wr(self.canary_id, 0, len(CANARY))]))
        regions = self.call(s, frame(b"\x05"))
        s.close()
        return hashlib.sha1((data or b"?") + (regions or b"?")).hexdigest()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _error(reply: Optional[bytes]) -> str:
    if reply is None:
        return "closed"
    if reply[:1] == b"\x01":
        n = struct.unpack("<H", reply[2:4])[0]
        return "error: " + reply[4:4 + n].decode(errors="replace")
    return f"reply {reply[:16].hex()}"


def _failed_status(reply: Optional[bytes]) -> Optional[int]:
    """The status of a POST's single failed completion, if that is what came."""
    if reply is None or reply[:2] != b"\x00\x06" or len(reply) < 8 or reply[6] != 3:
        return None
    return reply[7]


Case = Tuple[str, str, Callable[[Node], str], Callable[[str], bool], str]


def cases(node: Node) -> List[Case]:
    c = node.canary_id

    def raw(data: bytes, greet: bool = True) -> Callable[[Node], str]:
        def go(n: Node) -> str:
            s = n.connect(greet)
            try:
                return _error(n.call(s, data))
            finally:
                s.close()
        return go

    def status(data: bytes) -> Callable[[Node], str]:
        def go(n: Node) -> str:
            s = n.connect()
            try:
                r = n.call(s, data)
                st = _failed_status(r)
                return f"failed completion {st}" if st is not None else _error(r)
            finally:
                s.close()
        return go

    def cut(n: Node) -> str:
        s = n.connect()
        s.sendall(struct.pack("<I", 1000) + b"\x06" + b"\x00" * 10)
        s.close()  # mid-frame
        return "closed mid-frame"

    def flood(n: Node) -> str:
        time.sleep(0.2)  # connections of the state checks close
        held = [n.connect() for _ in range(MAX_CONNECTIONS)]
        try:
            extra = socket.create_connection(n.addr, timeout=15)
            got = _error(n.call(extra, hello()))
            extra.close()
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)  # the node counts the closed ones down
        return got

    def closed_or_error(needle: str) -> Callable[[str], bool]:
        return lambda got: got == "closed" or (got.startswith("error") and needle in got)

    def error(needle: str) -> Callable[[str], bool]:
        return lambda got: got.startswith("error") and needle in got

    def failed(code: int) -> Callable[[str], bool]:
        return lambda got: got == f"failed completion {code}"

    return [
        ("frame", "length 0", raw(struct.pack("<I", 0)), error("frame"), "error"),
        ("frame", "length 2**32-1", raw(struct.pack("<I", 2**32 - 1)), error("frame"), "error"),
        ("frame", "length 64 MiB + 1", raw(struct.pack("<I", (64 << 20) + 1)), error("frame"), "error"),
        ("frame", "cut mid-frame", cut, lambda g: g == "closed mid-frame", "closed"),
        ("frame", "unknown kind", raw(frame(b"\x09abc")), error("unknown request kind"), "error"),
        ("hello", "a POST first", raw(post([read_wr(c, 0, 8)]), greet=False), error("HELLO"), "error"),
        ("hello", "wrong magic", raw(hello(magic=b"VTDXMEM1"), greet=False), error("magic"), "error"),
        ("hello", "version 1 (before FLUSH)", raw(hello(1), greet=False), error("version"), "error"),
        ("hello", "version 2 (before the boot number)", raw(hello(2), greet=False), error("version"), "error"),
        ("hello", "version 4", raw(hello(4), greet=False), error("version"), "error"),
        ("hello", "bytes after", raw(frame(hello()[4:] + b"x"), greet=False), error("after"), "error"),
        ("post", "count 2**31, no requests", raw(post([], count=2**31)), error("work requests"), "error"),
        ("post", "count 5000", raw(post([read_wr(c, 0, 1)] * 5000)), error("work requests"), "error"),
        ("post", "count beyond the frame", raw(post([read_wr(c, 0, 1)], count=3)), error("work requests"), "error"),
        ("post", "unknown verb", raw(post([struct.pack("<BIQI", 9, c, 0, 1)])), error("unknown verb"), "error"),
        ("post", "READs beyond a reply", raw(post([read_wr(c, 0, 2**32 - 1)] * 2)), error("reading"), "error"),
        ("post", "WRITE shorter than its length", raw(post([struct.pack("<BIQI", 2, c, 0, 100) + b"x"])), error(""), "error"),
        ("verb", "READ past the end", status(post([read_wr(c, len(CANARY) - 4, 8)])), failed(2), "out of bounds"),
        ("verb", "READ at 2**64-4", status(post([read_wr(c, 2**64 - 4, 8)])), failed(2), "out of bounds"),
        ("verb", "WRITE past the end", status(post([write_wr(c, len(CANARY), b"x")])), failed(2), "out of bounds"),
        ("verb", "unknown region", status(post([read_wr(999_999, 0, 8)])), failed(1), "unknown region"),
        ("verb", "unaligned CAS", status(post([cas_wr(c, 4, 0, 1)])), failed(3), "unaligned"),
        ("verb", "FLUSH past the end", status(post([flush_wr(c, 8, len(CANARY))])), failed(2), "out of bounds"),
        ("verb", "FLUSH at 2**64-1", status(post([flush_wr(c, 2**64 - 1, 2)])), failed(2), "out of bounds"),
        ("region", "beyond the node's size", raw(create(b"big", SIZE + 1)), error("does not fit"), "error"),
        ("region", "size 0", raw(create(b"zero", 0)), error("at least"), "error"),
        ("region", "size 2**64-1", raw(create(b"huge", 2**64 - 1)), error("does not fit"), "error"),
        ("region", "empty name", raw(create(b"", 8)), error("name"), "error"),
        ("region", "name not UTF-8", raw(create(b"\xff\xfe", 8)), error("UTF-8"), "error"),
        ("region", "a name in use", raw(create(b"canary", 8)), error("exists"), "error"),
        ("region", "open unknown", raw(open_region(b"nothing")), error("no region"), "error"),
        ("region", "drop unknown", raw(frame(b"\x04" + name_bytes(b"nothing"))), error("no region"), "error"),
        ("limits", f"{MAX_CONNECTIONS + 1} connections", flood, closed_or_error("connections"), "error or closed"),
    ]


def run(work: Path, cli: str, verbose: bool, result_type: Any, print_record: Callable[[Dict[str, Any]], None]) -> List[Dict[str, Any]]:
    node = Node(cli, work / "memnode.log").start()
    out: List[Dict[str, Any]] = []
    try:
        base_threads = node.threads()
        for group, name, fn, check, expect in cases(node):
            r = result_type("memnode", group, name, expect)
            before = node.state()
            t0 = time.perf_counter()
            try:
                r.got = fn(node)
                if not check(r.got):
                    r.problems.append(f"expected {expect}")
            except Exception as e:  # noqa: BLE001
                r.got = f"{type(e).__name__}: {e}"
                r.problems.append("the case itself failed (a hang or a refused connection?)")
            r.seconds = time.perf_counter() - t0
            if not node.alive():
                r.problems.append("the memory node died")
                node = Node(cli, work / "memnode.log").start()
            else:
                try:
                    if node.state() != before:
                        r.problems.append("state changed")
                except Exception as e:  # noqa: BLE001
                    r.problems.append(f"a good client was refused afterwards: {e}")
                time.sleep(0.05)
                if node.threads() > base_threads + 2:
                    r.problems.append(f"threads {base_threads} -> {node.threads()}")
            rec = r.record()
            out.append(rec)
            if verbose or not r.ok:
                print_record(rec)
    finally:
        node.stop()
    return out
