"""Pickles read without running them: every opcode to STOP, every global an inert stub. Stdlib only.

A checkpoint pulled from a rented machine is untrusted input, and unpickling runs whatever callables
its globals name. `InertUnpickler` is the C unpickler with `find_class` answering every global
(`torch._utils._rebuild_tensor_v2`, `argparse.Namespace`, `os.system`) with a class of our own that
only records what it was given: nothing named in the file is imported or called. Calls (REDUCE,
NEWOBJ), states (BUILD) and items appended or set on such an object are kept on it, so a caller can
read plain values back (a DCP `.metadata`'s storage ranges, a DeepSpeed `dp_world_size`).
`persistent_load` records torch's storage references, `('storage', type, key, location, numel)`.

Also here: the legacy (non-zip) torch format, five pickles then each storage's bytes, walked to its
end (`scan_legacy_torch`).
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import IO, Any, NamedTuple

# The number torch's legacy format opens with, and its protocol version.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
TRUNCATED = "pickle ends before STOP (truncated)"
# Bytes per element of each storage type torch writes (the type's name in the pickle).
# UntypedStorage (what torch 2.x writes for dtypes newer than these) counts bytes.
ITEMSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "LongStorage": 8, "IntStorage": 4,
    "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1, "BFloat16Storage": 2,
    "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QInt8Storage": 1, "QInt32Storage": 4,
    "QUInt8Storage": 1, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1,
    # a dtype in the storage's place (the typed-storage form): its own size
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex128": 16, "complex64": 8,
}


class Stub:
    """What a global of the pickle becomes: a class made for it (`module`, `name`), never the real
    one; calling it (or NEWOBJ) makes an instance that keeps its arguments, state and items."""

    module = ""
    name = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        obj = object.__new__(cls)
        obj.args = args
        obj.kwargs = kwargs
        obj.state = None
        obj.items = []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args: tuple[Any, ...]
        self.kwargs: dict[str, Any]
        self.state: Any
        self.items: list[Any]

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def append(self, value: Any) -> None:
        self.items.append(value)

    def extend(self, values: Any) -> None:
        self.items.extend(values)

    def __call__(self, *args: Any, **kwargs: Any) -> Stub:
        # an object called in turn (REDUCE on a stub instance): another inert record
        return Stub(*args, **kwargs)

    def fields(self) -> dict[str, Any]:
        """The attributes BUILD gave it (a dict state, or the dicts of a (dict, slots) state)."""
        out: dict[str, Any] = {}
        parts = self.state if isinstance(self.state, tuple) else (self.state,)
        for part in parts:
            if isinstance(part, dict):
                out.update(part)
        return out


class Storage(NamedTuple):
    """One storage reference of a torch pickle."""

    type: str  # its type's name as the pickle gives it: "FloatStorage", "UntypedStorage", ...
    key: str
    numel: int

    def nbytes(self) -> int | None:
        size = ITEMSIZE.get(self.type)
        return None if size is None else size * self.numel


class InertUnpickler(pickle.Unpickler):
    """Reads a pickle to STOP; globals are stubs, persistent ids are recorded."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file, encoding="latin1")
        self.globals: set[tuple[str, str]] = set()
        self.pids: list[Any] = []
        self._classes: dict[tuple[str, str], type[Stub]] = {}

    def find_class(self, module: str, name: str) -> type[Stub]:
        key = (str(module), str(name))
        self.globals.add(key)
        cls = self._classes.get(key)
        if cls is None:
            cls = type("stub", (Stub,), {"module": key[0], "name": key[1]})
            self._classes[key] = cls
        return cls

    def persistent_load(self, pid: Any) -> Any:
        self.pids.append(pid)
        return Stub()


class Scan(NamedTuple):
    """What a pickle holds, read without running it."""

    root: Any  # the unpickled object: plain values with Stub instances in place of objects
    globals: frozenset[tuple[str, str]]
    storages: tuple[Storage, ...]
    error: str | None

    def global_names(self) -> list[str]:
        return sorted(f"{m}.{n}" for m, n in self.globals)


def _storage(pid: Any) -> Storage | str:
    """A torch storage reference `('storage', type, key, location, numel[, view])`, or why not."""
    if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] not in ("storage", b"storage"):
        return f"persistent id {str(pid)[:60]} is not a torch storage reference"
    typ, key, numel = pid[1], pid[2], pid[4]
    tname = typ.name if isinstance(typ, type) and issubclass(typ, Stub) else str(typ)
    if not isinstance(numel, int) or numel < 0:
        return f"storage {key} has no element count"
    return Storage(tname, key.decode("latin1") if isinstance(key, bytes) else str(key), numel)


def scan(file: IO[bytes] | bytes) -> Scan:
    """Read one pickle to its STOP (from bytes or a file, left right after the STOP)."""
    stream = io.BytesIO(file) if isinstance(file, (bytes, bytearray, memoryview)) else file
    u = InertUnpickler(stream)
    try:
        root = u.load()
        error = None
    except EOFError:
        root, error = None, TRUNCATED
    except Exception as e:  # anything the opcodes do wrong is the finding
        root = None
        text = str(e)
        error = TRUNCATED if "truncated" in text else f"pickle unreadable: {type(e).__name__}: {text[:160]}"
    storages: list[Storage] = []
    for pid in u.pids:
        ref = _storage(pid)
        if isinstance(ref, str):
            error = error or ref
        else:
            storages.append(ref)
    return Scan(root, frozenset(u.globals), tuple(storages), error)


class Bounded(io.RawIOBase):
    """A file read through: never asked for more than it holds (a pickle's claimed length cannot make
    the reader allocate it), and every byte handed on to `feed` (the sha256 of the same read)."""

    def __init__(self, f: IO[bytes], size: int, feed: Any = None) -> None:
        self.f, self.left, self.feed = f, size, feed

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")[:self.left]
        n = self.f.readinto(view) or 0  # type: ignore[attr-defined]
        self.left -= n
        if self.feed is not None and n:
            self.feed(view[:n])
        return n


def scan_legacy_torch(f: IO[bytes]) -> tuple[Scan, str | None]:
    """Walk a legacy torch file to its end: magic, protocol, system info, the object's pickle, the
    storage keys, then each storage's 8-byte element count and bytes. (scan of the object, error)."""
    for what, want in (("magic number", LEGACY_MAGIC), ("protocol", LEGACY_PROTOCOL)):
        first = scan(f)
        if first.error or first.root != want:
            return first, first.error or f"not a legacy torch file (bad {what})"
    info = scan(f)
    if info.error:
        return info, f"system info: {info.error}"
    obj = scan(f)
    if obj.error:
        return obj, obj.error
    keys = scan(f)
    if keys.error or not isinstance(keys.root, list):
        return obj, f"storage keys: {keys.error or 'not a list'}"
    refs = {s.key: s for s in obj.storages}
    for key in keys.root:
        key = key.decode("latin1") if isinstance(key, bytes) else str(key)
        ref = refs.get(key)
        if ref is None:
            return obj, f"storage {key} is listed but no tensor references it"
        head = f.read(8)
        if len(head) < 8:
            return obj, f"storage {key} is missing (file ends; truncated)"
        (numel,) = struct.unpack("<q", head)
        need = ref.nbytes()
        if need is None:
            return obj, f"storage {key} has unknown type {ref.type}"
        if numel != ref.numel:
            return obj, f"storage {key} holds {numel} elements, the pickle says {ref.numel}"
        got = _skip(f, need)
        if got < need:
            return obj, f"storage {key} needs {need} bytes, file has {got} (truncated)"
    return obj, None


def _skip(f: IO[bytes], n: int) -> int:
    """Read (through any hashing wrapper) and drop n bytes; how many there were."""
    got = 0
    buf = bytearray(min(n, 1 << 20))
    view = memoryview(buf)
    while got < n:
        k = f.readinto(view[:min(len(buf), n - got)])  # type: ignore[attr-defined]
        if not k:
            break
        got += k
    return got
