"""Files that ship inside the package: the default configs (`protdp/configs/`).

The library never reads the repository: configs are package data found with
`importlib.resources`, so an installed wheel has the same defaults as a checkout (whose
top-level `configs/` is a link to the same files).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from protdp.errors import ConfigError


def config_file(relpath: str | Path) -> Path:
    """Path of a packaged config, e.g. `config_file("model/tiny.yaml")`."""
    path = Path(str(resources.files("protdp").joinpath("configs", str(relpath))))
    if not path.is_file():
        raise ConfigError(f"no packaged config '{relpath}' (see protdp/configs/)")
    return path


def resolve_config(path: str | Path, kind: str | None = None, what: str = "config file") -> Path:
    """A user's config path, else the packaged one it names.

    An existing file wins. Otherwise `configs/<rel>` (the repository's spelling) and `<kind>/<name>`
    or `<name>` (e.g. `--model-config small` with kind "model") are looked up in the packaged
    configs; anything else is an error naming the path.
    """
    p = Path(path)
    if p.is_file():
        return p
    text = str(path)
    candidates = [text.removeprefix("configs/")] if text.startswith("configs/") else []
    if kind and "/" not in text:
        name = text if text.endswith((".yaml", ".yml")) else f"{text}.yaml"
        candidates.append(f"{kind}/{name}")
    for rel in candidates:
        packaged = Path(str(resources.files("protdp").joinpath("configs", rel)))
        if packaged.is_file():
            return packaged
    if p.is_dir():
        raise ConfigError(f"{path}: a directory, not a {what}")
    raise ConfigError(f"{path}: {what} not found")
