"""Zip archives checked record by record, in the one read that also hashes the file. Stdlib only.

torch.save writes a zip (stored, not compressed): `<archive>/data.pkl` (the object, whose tensors are
persistent ids naming storages), `<archive>/data/<key>` (each storage's bytes) and a few small
records. torch.load does not check the records' CRC32, so a flipped byte inside a tensor loads.

The central directory is read first (zipfile: a small read at the end of the file); then the file is
read once, start to end: each chunk goes to sha256 (when the manifest's hash is checked) and to a
`ZipPass`, which finds each record's local header in the stream and runs zlib.crc32 over its data
range, keeping the bytes of the records asked for (`data.pkl`). sha256 and the CRCs run in two
threads over the same buffers (both release the GIL), so the CRC costs no second read and little
time. Then the pickle is read without running it (`ablate.remote.checkpoints.pickles`) and every storage it
references must be a record with at least the bytes its elements need.

A DCP `.distcp` file is several such archives end to end: `windows` gives their ranges.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable
from typing import IO, Any, NamedTuple

from ablate.remote.checkpoints import pickles

LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a zip local file header, 30 bytes
LOCAL_SIG = b"PK\x03\x04"
CHUNK = 1 << 20
BUFFERS = 8  # chunks in flight between the reading thread and the sha256 and CRC threads
THREADED = 8 << 20  # below this size one thread does both
PREFETCH = 32 << 20  # bytes asked of the disk ahead of the read (posix_fadvise WILLNEED)


class Record(NamedTuple):
    name: str
    header: int  # offset of its local header in the file
    size: int  # bytes in the file (compressed size)
    raw_size: int  # bytes once inflated
    crc: int
    method: int  # 0 stored, 8 deflated
    window: int  # which archive of the file (0 but for a `.distcp`)


def directory(path: str, windows: Iterable[tuple[int, int]] | None = None,
              ) -> tuple[list[Record], str | None]:
    """Every record of the archive(s), by header offset, or why the directory cannot be read."""
    out: list[Record] = []
    spans = list(windows) if windows is not None else [(0, -1)]
    with open(path, "rb") as f:
        for w, (start, length) in enumerate(spans):
            try:
                src: IO[bytes] = f if length < 0 else _Window(f, start, length)  # type: ignore[assignment]
                with zipfile.ZipFile(src) as z:
                    infos = z.infolist()
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error) as e:
                where = "" if length < 0 else f" of the archive at {start}"
                return [], f"zip central directory{where} unreadable (truncated or damaged): {e}"
            out += [Record(i.filename, start + i.header_offset, i.compress_size, i.file_size,
                           i.CRC, i.compress_type, w) for i in infos]
    return sorted(out, key=lambda r: r.header), None


class _Window:
    """A byte range of a file as a seekable file of its own (one archive inside a `.distcp`)."""

    def __init__(self, f: IO[bytes], start: int, length: int) -> None:
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else self.length + off
        if self.pos < 0:
            raise OSError("seek before the window")
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n < 0 else min(n, self.length - self.pos)
        self.f.seek(self.start + self.pos)
        data = self.f.read(max(0, n))
        self.pos += len(data)
        return data

    def seekable(self) -> bool:
        return True


class ZipPass:
    """Fed the file's bytes in order: each record's local header found, its data's CRC32 computed."""

    def __init__(self, records: list[Record], keep: Callable[[str], bool] = lambda _: False) -> None:
        self.records, self.keep = records, keep
        self.kept: dict[tuple[int, str], bytes] = {}  # (window, name): bytes
        self.problems: list[str] = []
        self.i = 0
        self._reset()

    def _reset(self) -> None:
        self.head = bytearray()
        self.start: int | None = None  # where record i's data begins, once its header is read
        self.done, self.crc, self.out = 0, 0, 0
        self.inflate: Any = None
        self.parts: list[bytes] | None = None

    def _next(self, problem: str | None = None) -> None:
        if problem:
            self.problems.append(problem)
        self.i += 1
        self._reset()

    def feed(self, pos: int, chunk: memoryview) -> None:
        end = pos + len(chunk)
        while self.i < len(self.records):
            r = self.records[self.i]
            if self.start is None:
                at = r.header + len(self.head)
                if at < pos:
                    self._next(f"zip record {r.name} overlaps the record before it (damaged)")
                    continue
                if at >= end:
                    return
                need = LOCAL.size if len(self.head) < LOCAL.size else LOCAL.size + self._extra()
                self.head += chunk[at - pos:min(end, r.header + need) - pos]
                if len(self.head) == LOCAL.size:
                    if self.head[:4] != LOCAL_SIG:
                        self._next(f"zip record {r.name} has no local header at {r.header} (damaged)")
                        continue
                    need = LOCAL.size + self._extra()
                if len(self.head) == need:
                    self._begin(r)
                continue
            at = self.start + self.done
            stop = min(end, self.start + r.size)
            if at < stop:
                self._data(r, chunk[at - pos:stop - pos])
            if self.done < r.size:
                return
            self._end(r)

    def _extra(self) -> int:
        fields = LOCAL.unpack(bytes(self.head[:LOCAL.size]))
        return int(fields[9]) + int(fields[10])

    def _begin(self, r: Record) -> None:
        self.start = r.header + len(self.head)
        if r.method == 8:
            self.inflate = zlib.decompressobj(-15)
        elif r.method != 0:
            self._next(f"zip record {r.name}: compression method {r.method} not supported")
            return
        self.parts = [] if self.keep(r.name) else None

    def _data(self, r: Record, piece: memoryview) -> None:
        self.done += len(piece)
        data: Any = piece
        if self.inflate is not None:
            try:
                data = self.inflate.decompress(piece)
            except zlib.error as e:
                data = b""
                self.problems.append(f"zip record {r.name} does not inflate: {e} (damaged)")
        self.crc = zlib.crc32(data, self.crc)
        self.out += len(data)
        if self.parts is not None:
            self.parts.append(bytes(data))

    def _end(self, r: Record) -> None:
        if self.inflate is not None:
            tail = self.inflate.flush()
            self.crc, self.out = zlib.crc32(tail, self.crc), self.out + len(tail)
            if self.parts is not None:
                self.parts.append(tail)
        if self.parts is not None:
            self.kept[(r.window, r.name)] = b"".join(self.parts)
        problem = None
        if self.crc != r.crc:
            problem = f"zip record {r.name} CRC32 mismatch (damaged)"
        elif self.out != r.raw_size:
            problem = f"zip record {r.name} holds {self.out} bytes, its directory says {r.raw_size}"
        self._next(problem)

    def finish(self) -> list[str]:
        """The problems, once the whole file was fed: a record not complete ran past its end."""
        if self.i < len(self.records):
            r = self.records[self.i]
            self.problems.append(f"zip record {r.name} runs past the end of the file (truncated)")
            self.i = len(self.records)
        return self.problems


def read_once(path: str, hash_it: bool, zpass: ZipPass | None) -> str | None:
    """Read the file once: its sha256 (hash_it) and every chunk fed to zpass. The sha256 or None.

    A large file is read by this thread while one helper thread hashes and another runs the CRCs
    over the same buffers (hashlib and zlib release the GIL): the wall time is the slower of the
    three, not their sum."""
    h = hashlib.sha256() if hash_it else None
    advise = getattr(os, "posix_fadvise", None)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        consumers: list[Callable[[int, memoryview], None]] = []
        if h is not None:
            consumers.append(lambda _pos, view: h.update(view))
        if zpass is not None:
            consumers.append(zpass.feed)
        threaded = size >= THREADED and consumers
        helpers = [concurrent.futures.ThreadPoolExecutor(max_workers=1) for _ in consumers] \
            if threaded else []
        bufs = [memoryview(bytearray(CHUNK)) for _ in range(BUFFERS if threaded else 1)]
        pending: list[list[concurrent.futures.Future[None]]] = [[] for _ in bufs]
        pos, ahead, k = 0, 0, 0
        try:
            while True:
                if advise is not None and pos + CHUNK > ahead and size > CHUNK:
                    advise(fd, ahead, PREFETCH, os.POSIX_FADV_WILLNEED)
                    ahead += PREFETCH
                for fut in pending[k]:
                    fut.result()  # every consumer is done with this buffer
                n = f.readinto(bufs[k])
                if not n:
                    break
                view = bufs[k][:n]
                if helpers:
                    pending[k] = [ex.submit(c, pos, view) for ex, c in zip(helpers, consumers, strict=True)]
                else:
                    for c in consumers:
                        c(pos, view)
                pos += n
                k = (k + 1) % len(bufs)
            for futs in pending:
                for fut in futs:
                    fut.result()
        finally:
            for ex in helpers:
                ex.shutdown(wait=True)
    return h.hexdigest() if h is not None else None


def is_pickle_record(name: str) -> bool:
    """`<archive>/data.pkl`: the object of a torch archive."""
    head, _, tail = name.rpartition("/")
    return tail == "data.pkl" and bool(head) and "/" not in head


def check_archive(records: list[Record], kept: dict[tuple[int, str], bytes], window: int = 0,
                  ) -> tuple[str | None, pickles.Scan | None]:
    """A torch archive's object against its records: (the first problem, the pickle's scan).

    Every storage the pickle references must be a record `<archive>/data/<key>` holding at least
    numel x itemsize bytes."""
    mine = [r for r in records if r.window == window]
    pkl = [r for r in mine if is_pickle_record(r.name)]
    if len(pkl) != 1:
        return (f"{'no' if not pkl else 'more than one'} <archive>/data.pkl record: not a torch "
                "archive"), None
    name = pkl[0].name
    if (window, name) not in kept:
        return f"zip record {name} was not read", None
    found = pickles.scan(kept[(window, name)])
    if found.error:
        return f"{name}: {found.error}", found
    prefix = name[:-len("data.pkl")] + "data/"
    sizes = {r.name: r.raw_size for r in mine}
    for ref in found.storages:
        record = prefix + ref.key
        need = ref.nbytes()
        if need is None:
            return f"storage {ref.key} has unknown type {ref.type}", found
        if record not in sizes:
            return f"storage {ref.key} has no record {record} (missing)", found
        if sizes[record] < need:
            return f"storage {ref.key} needs {need} bytes, record has {sizes[record]}", found
    return None, found
