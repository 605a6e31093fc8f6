"""YAML <-> typed dataclass mapping shared by every config in protdp.

Configs are dataclasses with a one-line docstring per field and validation in
`__post_init__` (Megatron-core style). YAML files in `configs/` map 1:1 onto them:
an unknown key is an error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml

from protdp.errors import ConfigError

T = TypeVar("T")


def yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: FILE:LINE:COLUMN: invalid YAML: problem."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{where}: invalid YAML: {problem}" + (f" ({context})" if context else "")


MAX_YAML_DEPTH = 32        # nesting levels of a config file (PyYAML recurses per level)


class _StrictYAMLError(yaml.MarkedYAMLError):
    pass


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, strict: a key given twice in one mapping is an error naming its
    line (PyYAML keeps the last silently), and nesting deeper than `MAX_YAML_DEPTH` is an error
    naming the line (PyYAML's recursive composer raised RecursionError)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _StrictYAMLError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = self.construct_scalar(key_node)
                    if key in seen:
                        raise _StrictYAMLError(None, None, f"duplicate key '{key}' (first given on "
                                            f"line {seen[key] + 1})", key_node.start_mark)
                    seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(stream) -> Any:
    """`yaml.load` with `StrictLoader` (every protdp YAML reader goes through it)."""
    return yaml.load(stream, Loader=StrictLoader)


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; a clear error names the file on syntax problems, duplicate keys and
    excessive nesting (`StrictLoader`)."""
    path = Path(path)
    try:
        with open(path) as fh:
            data = load_yaml_text(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied reading the config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text (UTF-8) YAML file (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(path, exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def from_dict(cls: type[T], data: Mapping[str, Any], source: str = "<dict>") -> T:
    """Build dataclass `cls` from a mapping, recursing into nested dataclass fields."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown} for {cls.__name__}; "
                          f"expected some of {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        ftype = hints.get(key)
        if dataclasses.is_dataclass(ftype) and isinstance(value, Mapping):
            value = from_dict(ftype, value, source=f"{source}:{key}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(cls: type[T], path_or_obj: "str | Path | Mapping | T | None") -> T:
    """Accept a YAML path, a mapping, an instance of `cls`, or None (defaults)."""
    if path_or_obj is None:
        return cls()
    if isinstance(path_or_obj, cls):
        return path_or_obj
    if isinstance(path_or_obj, Mapping):
        return from_dict(cls, path_or_obj)
    return from_dict(cls, read_yaml(path_or_obj), source=str(path_or_obj))


def to_dict(obj) -> dict:
    """Dataclass -> plain dict (for YAML/JSON provenance and checkpoints)."""
    return dataclasses.asdict(obj)
