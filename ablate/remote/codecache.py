"""A zipapp's modules compiled once per host and interpreter, not at every start. Stdlib only.

Python's zipimport never writes bytecode into the archive, so every start of a zipapp compiles each
module it imports from source: ~170 ms of CPU for the runner's `serve` (the resume keeper, the
checkpoint checks, the store client), paid at every queue's start, every calibration and every Python
start of its own, on every host. `install(archive)` puts a finder before zipimport that loads the
archive's modules from code objects kept where the host agent keeps its own
(`${XDG_CACHE_HOME:-$HOME/.cache}/ablate/code/<cache tag>/`), one file per module and source:
`<module>.<source hash>.bin` holding `sys.version` and the optimisation level, the crc32 of the
marshalled code, the code. The source hash is the one CPython checks hash-based .pyc files with
(`_imp.source_hash`), so a new source never meets an old code object; a torn or foreign file fails
its check and the module is compiled again and written atomically (a temp name of its own: a home
shared by several hosts is written by all of them). Without HOME, or where the cache cannot be
written, modules are compiled as before; nothing here can stop an import that zipimport could do.
As with Python's own bytecode, nothing is written under PYTHONDONTWRITEBYTECODE or `-B`.
"""

from __future__ import annotations

import _imp
import binascii
import contextlib
import marshal
import os
import sys
import zipimport
from collections.abc import Mapping
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

KEY = 0x61626c61  # the source hash's key ("abla"): any fixed key; CPython's pycs use the magic number


def cache_dir(env: Mapping[str, str] = os.environ) -> str | None:
    """Where this interpreter's code objects are kept, or None without a home to keep them in."""
    base = env.get("XDG_CACHE_HOME") or (env["HOME"] + "/.cache" if env.get("HOME") else "")
    tag = sys.implementation.cache_tag
    return os.path.join(base, "ablate", "code", tag) if base and tag else None


def header() -> bytes:
    """What a kept code object must have been compiled under: this interpreter and optimisation level."""
    return sys.version.encode() + b"\0" + str(sys.flags.optimize).encode() + b"\0"


class CachedZip:
    """The finder and loader of one archive's modules (`sys.meta_path`)."""

    def __init__(self, archive: str, where: str | None) -> None:
        self.archive, self.where = archive, where
        self.zip = zipimport.zipimporter(archive)
        self.sources: dict[str, bytes] = {}  # found, not loaded yet

    def _source(self, rel: str) -> bytes | None:
        if rel in self.sources:
            return self.sources.pop(rel)
        try:
            return self.zip.get_data(rel)
        except OSError:
            return None

    @staticmethod
    def _files(name: str) -> tuple[tuple[str, bool], tuple[str, bool]]:
        """Where module `name` may be in the archive: (path, is a package), the package first."""
        rel = name.replace(".", "/")
        return (rel + "/__init__.py", True), (rel + ".py", False)

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        for inner, pkg in self._files(name):
            source = self._source(inner)
            if source is not None:
                self.sources[inner] = source
                # a Loader by its methods: importlib.abc's import costs ~20 ms
                spec = ModuleSpec(name, self, origin=os.path.join(self.archive, inner),  # type: ignore[arg-type]
                                  is_package=pkg)
                if pkg:
                    spec.submodule_search_locations = [os.path.join(self.archive, os.path.dirname(inner))]
                spec.has_location = True
                return spec
        return None

    def get_source(self, name: str) -> str | None:
        """For tracebacks (linecache asks the module's loader)."""
        for inner, _ in self._files(name):
            with contextlib.suppress(OSError):
                return self.zip.get_data(inner).decode("utf-8", errors="replace")
        return None

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None and spec.origin is not None
        exec(self.code(spec.name, spec.origin), module.__dict__)

    def code(self, name: str, origin: str) -> CodeType:
        """`name`'s code: the kept one when it is there and whole, else compiled (and kept)."""
        source = self._source(origin[len(self.archive) + 1:])
        if source is None:
            raise ImportError(f"{origin} went from {self.archive}", name=name)
        if self.where is None:
            return compile(source, origin, "exec", dont_inherit=True)
        path = os.path.join(self.where, f"{name}.{_imp.source_hash(KEY, source).hex()}.bin")
        head = header()
        try:
            with open(path, "rb") as f:
                kept = f.read()
            k = len(head) + 8
            if kept[:k] == head + b"%08x" % binascii.crc32(kept[k:]):
                code = marshal.loads(kept[k:])
                if isinstance(code, CodeType):
                    return code
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = compile(source, origin, "exec", dont_inherit=True)
        if not sys.dont_write_bytecode:  # as Python's own imports: PYTHONDONTWRITEBYTECODE, -B
            keep(path, head, code)
        return code


def keep(path: str, head: bytes, code: CodeType) -> None:
    """Write `code` to `path` atomically; a failure leaves nothing there and is not an error."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}"
    try:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        data = marshal.dumps(code)
        with open(tmp, "wb") as f:
            f.write(head + b"%08x" % binascii.crc32(data) + data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def install(archive: str) -> None:
    """Serve `archive`'s modules from the cache from now on (before zipimport's own finder); its
    path is taken absolute now, before anything changes the working directory."""
    sys.meta_path.insert(0, CachedZip(os.path.abspath(archive), cache_dir()))
