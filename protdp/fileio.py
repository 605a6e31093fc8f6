"""Small file helpers shared across layers (provenance hashes of inputs and checkpoints)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in `chunk`-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def torch_load_refusal(exc: BaseException) -> str:
    """Why `torch.load(..., weights_only=True)` refused a file, in one line. torch's own text is
    a paragraph whose first advice, to load with weights_only=False, would run code from an
    untrusted pickle; for a file that is not a checkpoint at all it is simply wrong."""
    text = str(exc)
    pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if pickled:
        return (f"it holds pickled Python objects ({pickled.group(1)}) besides tensors, which "
                "protdp does not unpickle (that can run code); save its state dict of tensors "
                "alone and give that file")
    if "Weights only load failed" in text:
        return "not a PyTorch checkpoint (neither a torch.save archive nor a pickle of tensors)"
    if isinstance(exc, EOFError) or "zip archive" in text:
        return "empty, truncated or corrupt (the torch.save archive cannot be read)"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"cannot be read by torch.load ({type(exc).__name__}: {first})"
