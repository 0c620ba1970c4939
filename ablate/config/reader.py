"""Reading `ablate.yaml` and profiles: YAML that refuses duplicate keys, and a walker over one
mapping that checks keys and types and names the file and key path in every error, with
"did you mean …?" for unknown keys."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from ablate.errors import ConfigError


def suggest(word: str, options: Any) -> str:
    import difflib  # an error's hint only

    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Reader:
    """Walks one YAML mapping, checking keys and types, remembering the key path for errors."""

    def __init__(self, data: Any, file: str, path: str, allowed: set[str]) -> None:
        self.file = file
        self.path = path
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: {path or 'top level'} must be a mapping, got {tname(data)}")
        for key in data:
            if not isinstance(key, str) or key not in allowed:
                raise ConfigError(
                    f"{file}: unknown key {self._k(str(key))}{suggest(str(key), allowed)}; "
                    f"allowed: {', '.join(sorted(allowed))}"
                )
        self.data: dict[str, Any] = data

    def _k(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def err(self, key: str, why: str) -> ConfigError:
        return ConfigError(f"{self.file}: {self._k(key)}: {why}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        v = self.data.get(key)
        if v is None:
            if required:
                raise self.err(key, "is required")
            return default
        if not isinstance(v, str) or not v.strip():
            raise self.err(key, f"must be a non-empty string, got {v!r}")
        if "\r" in v or "\x00" in v:
            raise self.err(key, "contains a carriage return or NUL (file edited on Windows?); "
                                "save it with Unix line endings")
        return v

    def num(self, key: str, default: float, *, positive: bool = True) -> float:
        v = self.data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(key, f"must be a finite number, got {v!r}")
        if positive and not v > 0:
            raise self.err(key, f"must be > 0, got {v!r}")
        return float(v)

    def whole(self, key: str, default: int | None = None, *, required: bool = False) -> int | None:
        v = self.data.get(key, default)
        if v is None:
            if required:
                raise self.err(key, "is required")
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise self.err(key, f"must be a positive whole number, got {v!r}")
        return v

    def sub(self, key: str, allowed: set[str]) -> Reader:
        return Reader(self.data.get(key) or {}, self.file, self._k(key), allowed)


def tname(v: Any) -> str:
    if v is None:
        return "nothing (empty)"
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(v), type(v).__name__)


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key; the base class reports it
                break
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from e


def check_template(tmpl: str, fields: set[str], r: Reader, key: str) -> None:
    """Every `{field}` of a command template is one of `fields` (a typo is named, with the closest)."""
    for m in re.finditer(r"\{([^{}]*)\}", tmpl):
        if m.group(1) not in fields:
            raise r.err(key, f"unknown field {{{m.group(1)}}}{suggest(m.group(1), fields)}; "
                             f"fields: {', '.join('{' + f + '}' for f in sorted(fields))}")
