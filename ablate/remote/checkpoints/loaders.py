"""Files loaded by their own libraries (rule 7): torch `weights_only`, safetensors, numpy, JSON.

Stdlib only at import: each library is imported when a file that needs it is met, and a missing one
raises `NoLoader` with how to install it. Nothing here runs code from a file: torch loads only with
`weights_only=True` (its own allow-list, plus the numpy globals transformers allows for its
`rng_state.pth`), numpy with `allow_pickle=False`; `ablate.remote.checkpoints.filecheck` decides
which files get here, after their structure was checked.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import zipfile
from collections.abc import Iterable
from typing import Any

TORCH_EXT = (".pt", ".pth", ".ckpt", ".bin")
NUMPY_EXT = (".npy", ".npz")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_INSTALL = {
    "torch": "torch not installed: pip install 'ablate[torch]'",
    "safetensors": "safetensors not installed: pip install safetensors",
    "numpy": "numpy not installed: pip install numpy",
}
# What transformers' trainer_pt_utils.safe_globals() allows for rng_state.pth (numpy's RNG state),
# as the pickle names them (numpy 1.x: numpy.core.multiarray).
NUMPY_GLOBALS = frozenset({
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.dtypes", "UInt32DType"),
})
# Modules a weights_only-loadable pickle may name at all (the exact check asks torch).
_MAYBE_ALLOWED = ("torch", "collections", "builtins", "_codecs")
# safe_globals() adds to and removes from one process-wide set: loads that need the numpy globals
# hold this lock, so one thread's exit cannot take them away from another's load.
_NUMPY_LOCK = threading.Lock()


class NoLoader(Exception):
    """The library needed to load a file is not installed."""


def short(exc: BaseException) -> str:
    """One line from a library's (often multi-paragraph, ANSI-coloured) exception."""
    text = _ANSI.sub("", str(exc))
    # torch's weights_only refusal buries the reason after two paragraphs of advice.
    m = re.search(r"WeightsUnpickler error: ([^\n]*?\.)(?: |$)", text)
    if m:
        return f"refused by weights_only=True (not plain tensors): {m.group(1)}"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    msg = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return msg if len(msg) <= 240 else msg[:237] + "..."


def import_lib(module: str) -> Any:
    try:
        # import_module is a dict lookup once imported (__import__ with a fromlist searched the
        # path for a submodule "_" on every call: a third of the time of a small cell).
        return importlib.import_module(module)
    except ImportError as e:
        raise NoLoader(_INSTALL.get(module.split(".")[0], f"{module} not installed")) from e


def weights_only_refuses(names: Iterable[tuple[str, str]]) -> list[str]:
    """The globals torch.load(weights_only=True) refuses among these (the numpy ones transformers
    allows are allowed); [] when it takes them all. Imports torch only when no module rules it out."""
    rest = sorted({(m, n) for m, n in names if (m, n) not in NUMPY_GLOBALS})
    foreign = [f"{m}.{n}" for m, n in rest if m.split(".")[0] not in _MAYBE_ALLOWED]
    if foreign:
        return foreign
    import_lib("torch")
    wou = import_lib("torch._weights_only_unpickler")
    allowed = set(wou._get_allowed_globals()) | set(wou._get_user_allowed_globals())
    return [f"{m}.{n}" for m, n in rest if f"{m}.{n}" not in allowed]


def _numpy_safe_globals() -> list[Any]:
    np = import_lib("numpy")
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_torch(path: str, numpy_globals: bool = False) -> None:
    torch = import_lib("torch")
    # mmap keeps a large zip checkpoint out of RAM; the legacy format cannot be mmapped.
    kwargs = {"weights_only": True, "map_location": "cpu", "mmap": zipfile.is_zipfile(path)}
    if not numpy_globals:
        torch.load(path, **kwargs)
        return
    with _NUMPY_LOCK, torch.serialization.safe_globals(_numpy_safe_globals()):
        torch.load(path, **kwargs)


def load_safetensors(path: str, hashed: bool = False) -> None:
    safe_open = import_lib("safetensors").safe_open
    if hashed:
        # Opening parses and checks the whole header: each tensor's dtype, shape and byte range,
        # the ranges covering the file exactly. Its bytes were just read and matched the manifest's
        # sha256, so reading every tensor again finds nothing more and halves the throughput.
        with safe_open(path, framework="numpy") as f:
            f.keys()
        return

    def read_all(framework: str) -> None:
        with safe_open(path, framework=framework) as f:
            for key in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                f.get_tensor(key)  # one tensor in memory at a time

    try:
        import_lib("numpy")
        read_all("numpy")  # light: no torch start-up per worker
    except Exception as np_error:
        # numpy has no bfloat16 (and some other dtypes): torch decides before we call it corrupt.
        try:
            import_lib("torch")
        except NoLoader:
            raise np_error from None
        read_all("pt")


def load_numpy(path: str) -> None:
    np = import_lib("numpy")
    with open(path, "rb") as fh:
        loaded = np.load(fh, allow_pickle=False)
        if path.endswith(".npz"):
            for key in loaded.files:
                loaded[key]  # reading each member checks its data and CRC
            loaded.close()


def load_json(path: str, keys: list[str] | None) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not valid JSON: {short(e)}"
    if keys is None:
        return None
    if not isinstance(data, dict):
        return f"metrics must be a JSON object, got {type(data).__name__}"
    absent = [k for k in keys if k not in data]
    if absent:
        return f"metrics lack key(s) {', '.join(absent)} (have: {', '.join(sorted(data)) or 'none'})"
    return None


def load_file(path: str, role: str, metrics_keys: list[str] | None = None,
              hashed: bool = False) -> str | None:
    """Load a JSON, safetensors or numpy artifact by its type. An error string, or None when it
    loads. hashed: its sha256 was just checked (a safetensors file is then checked by its header
    alone). Raises NoLoader when the library for its type is missing."""
    lower = path.lower()
    try:
        if role == "metrics" or lower.endswith(".json"):
            return load_json(path, list(metrics_keys or []) if role == "metrics" else None)
        if lower.endswith(".safetensors"):
            load_safetensors(path, hashed)
        elif lower.endswith(NUMPY_EXT):
            load_numpy(path)
    except NoLoader:
        raise
    except Exception as e:  # any failure to load is the finding, whatever the library raises
        return f"load failed: {short(e)}"
    return None
