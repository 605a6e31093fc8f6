"""Upper bounds on every size a file or flag declares (issue 47, "bounded by the bytes").

A small file can declare a huge size: a checkpoint config with 10^7 Evoformer blocks, a
`--num-recycles 1000000000`, an HDF5 dataset header of (45·10^6, 37, 3) in a 278 KB store.
Each such number is checked here against a documented bound (and, for stored arrays, against
the bytes the file really holds) BEFORE anything is allocated, so a hostile file costs seconds
and one line, never memory. One definition of every bound; docs/formats.md ("Bounded by the
bytes") lists them.

The bounds are far above anything AlphaFold uses (48 Evoformer blocks, 4 extra-MSA blocks,
8 structure-module layers, 3 recycles for AF2 and 20 for AF-Multimer v3, 4 templates, 2,000+
residue crops at inference) and far below what would exhaust a machine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from protdp.errors import InputError

MAX_BLOCKS = 256
"""Evoformer / extra-MSA / template-pair blocks and structure-module layers (AF2: 48, 4, 2, 8)."""
MAX_CHANNELS = 4096
"""Any channel width, head count or bin count of a model config (AF2's widest: c_s 384,
transition 4 x 256)."""
MAX_RECYCLES = 200
"""Recycling passes at inference and in configs (AF2 3, AF-Multimer v3 20, ColabFold users
rarely above 48). Time grows with it; memory does not: the predictor builds each pass's MSA
sample when the pass starts (`protdp.data.msa_passes`)."""
MAX_TEMPLATES = 64
"""Templates per target (AF2 max_templates 4; templates.npz rows)."""
MAX_RESIDUES = 100_000
"""Residues of one family / complex / template (the largest PDB entries have ~ 50,000)."""
MAX_MSA_ROWS = 10_000_000
"""MSA rows of one family or chain as stored."""
MAX_WEIGHT_MAGNITUDE = 1e4
"""|value| of any weight any loader reads (`protdp.model.weight_checks`: model files, training
checkpoints and resume, multimer_model.pt, weights import): the AlphaFold fixtures' parameters
(DeepMind's initialisers) reach 4.02, protdp's and OpenFold-shaped ones 1.13
(benchmarks/results/weight_magnitudes.json); 1e30 is a corrupt or hostile file whose forward
pass overflows to NaN."""
MAX_SEED = 2 ** 32 - 1
"""Seeds are unsigned 32-bit, as AlphaFold's `random_seed` (numpy's legacy RandomState)."""
MAX_SEEDS = 100_000
"""Predictions per checkpoint (`--seeds`): massive-sampling runs (AFsample) use ~1,200; the
ensemble's member list is built up front."""
MAX_COMPRESSION_RATIO = 1100
"""Declared bytes per stored byte an HDF5 dataset may claim (gzip/deflate tops out at ~1032:1)."""
MAX_DECLARED_BYTES = 64 * 1024 ** 3
"""Bytes one stored array may declare, whatever the file size (64 GiB)."""
MAX_TEMPLATE_FILE_BYTES = 1024 ** 3
"""Bytes of one `--template` mmCIF, read once into memory so that the bytes hashed into a
prediction's identity are the bytes parsed for every target (1 GiB; the largest PDB entries'
mmCIF files, whole ribosomes and viral capsids, are a few hundred MB)."""
MAX_FEATURES_FILE_BYTES = 16 * 1024 ** 3
"""Bytes of one precomputed complex `features.npz` (`protdp predict` on a `complex features`
folder), read once into memory so that the bytes hashed are the bytes loaded (16 GiB). Its bulk
is the MSA-shaped members (msa int32, deletion_matrix float32 and their `_all_seq` twins: at
most 16 bytes per row x residue): at AlphaFold-Multimer's 2,048 MSA rows per chain
(MSA_CROP_SIZE), a 20-chain, 10,000-residue complex (beyond what an 80 GB card predicts) stores
20 x 2,048 x 10,000 x 16 B = 6.6 GB uncompressed; the loaded arrays take at least as much memory
again, so a larger file is refused before it is read."""


def check_count(value, bound: int, what: str, *, path=None, minimum: int = 0) -> int:
    """`value` as an int in [minimum, bound]; anything else is an InputError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        else:
            raise InputError(f"{what} must be an integer, got {value!r}"[:200], path=path)
    if value < minimum or value > bound:
        raise InputError(f"{what} {value} is outside [{minimum}, {bound}] (the documented bound, "
                         "protdp.data.bounds)", path=path)
    return value


def check_seed(value, what: str = "--random-seed") -> int:
    """A seed in [0, 2^32 - 1] (AlphaFold's unsigned 32-bit random_seed)."""
    return check_count(value, MAX_SEED, what)


def file_bytes(path) -> int:
    """The real size of a file in bytes (0 when it cannot be stat'ed)."""
    try:
        return os.stat(Path(path)).st_size
    except OSError:
        return 0


def declared_bytes(shape, itemsize: int) -> int:
    """Bytes an array of `shape` would take, in exact integer arithmetic."""
    n = int(itemsize)
    for d in shape:
        n *= int(d)
    return n


def dataset_problem(dataset, file_size: int, name: str) -> str | None:
    """Why an HDF5 dataset's declared size cannot be read (None: it may be read). Checked from
    the header only: shape x itemsize against MAX_DECLARED_BYTES and the file's real size x
    MAX_COMPRESSION_RATIO, so a 278 KB file declaring 20 GB is refused without reading it."""
    try:
        shape, itemsize = tuple(dataset.shape or ()), dataset.dtype.itemsize
    except (AttributeError, TypeError, ValueError, OSError, RuntimeError):
        return f"{name}: not a dataset"
    need = declared_bytes(shape, itemsize)
    limit = min(MAX_DECLARED_BYTES, max(file_size, 1) * MAX_COMPRESSION_RATIO)
    if need > limit:
        return (f"{name} declares shape {shape} ({need} bytes), more than the file's "
                f"{file_size} bytes can hold (bound {limit} bytes)")
    return None


def check_predict_bounds(seed, num_seeds: int, num_recycles) -> None:
    """`--random-seed`, `--seeds` and `--num-recycles` of a prediction, before any work: every
    seed of the ensemble in [0, 2^32 - 1] and recycles in [0, MAX_RECYCLES]."""
    check_seed(seed, "--random-seed")
    if isinstance(num_seeds, int) and not isinstance(num_seeds, bool):
        check_count(num_seeds, MAX_SEEDS, "--seeds", minimum=1)
        check_seed(seed + num_seeds - 1, "--random-seed + --seeds - 1 (the last seed)")
    if num_recycles is not None:
        check_count(num_recycles, MAX_RECYCLES, "--num-recycles")
