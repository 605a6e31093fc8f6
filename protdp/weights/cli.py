"""`protdp weights`: AlphaFold2 / OpenFold parameters in and out, and the check against
AlphaFold's own outputs.

    protdp weights import --format alphafold params_model_1_ptm.npz --out CKPT/
    protdp weights import --format openfold finetuning_ptm_2.pt --out CKPT/
    protdp weights export --format alphafold|openfold CKPT/ OUT
    protdp weights compare --checkpoint CKPT/ --features features.npz --reference outputs.npz \
        [--dtype float32|float64] [--sampled-msa sampled_msa.npz]

compare detects an AlphaFold-Multimer checkpoint and then needs --sampled-msa (AlphaFold's
recorded in-model MSA sampling; protdp.weights.compare_multimer).

An imported CKPT/ is an ordinary protdp checkpoint (model.pt + provenance.json): predict,
calibrate, redteam and training take it. compare prints one JSON object and exits 0 when every
figure is within tolerance, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from protdp.data.bounds import MAX_BLOCKS, MAX_RECYCLES
from protdp.errors import ConfigError, InputError
from protdp.weights.convert import FORMATS
from protdp.weights.guard import check_import


def _integer(minimum: int, maximum: int | None = None):
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{value}'") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        if maximum is not None and n > maximum:     # protdp.data.bounds (issue 47)
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {n}")
        return n
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp weights", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="AlphaFold npz / OpenFold .pt -> protdp checkpoint folder")
    imp.add_argument("source", help="params_model_N[_ptm].npz (alphafold) or a .pt state dict (openfold)")
    imp.add_argument("--format", required=True, choices=FORMATS)
    imp.add_argument("--out", required=True, help="checkpoint folder to write (model.pt, provenance.json)")
    imp.add_argument("--sm-layers", type=_integer(1, MAX_BLOCKS), default=None,
                     help="structure-module layers (not in the arrays; AF2: 8)")
    imp.add_argument("--num-recycles", type=_integer(0, MAX_RECYCLES), default=None,
                     help="recycling passes at inference (not in the arrays; AF2: 3)")
    imp.add_argument("--alphafold-config", default=None,
                     help="AlphaFold model config as JSON (its model.heads.structure_module."
                          "num_layer and model.num_recycle fill the two values above)")
    exp = sub.add_parser("export", help="protdp checkpoint -> AlphaFold npz / OpenFold .pt")
    exp.add_argument("checkpoint", help="protdp checkpoint (imported folder, model file or training run)")
    exp.add_argument("out", help="file to write")
    exp.add_argument("--format", required=True, choices=FORMATS)
    exp.add_argument("--force", action="store_true",
                     help="replace an existing file of another kind (e.g. a database) at OUT")
    cmp_ = sub.add_parser("compare", help="protdp vs AlphaFold's outputs on AlphaFold's features")
    cmp_.add_argument("--checkpoint", required=True)
    cmp_.add_argument("--features", required=True, help="AlphaFold processed-feature dict (.npz)")
    cmp_.add_argument("--reference", required=True, help="AlphaFold output dict (.npz, '/'-joined keys)")
    cmp_.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    cmp_.add_argument("--sampled-msa", default=None,
                      help="multimer checkpoints: AlphaFold's recorded in-model MSA sampling "
                           "(.npz: index_order, optional template_unit_diagonal)")
    return p


def _alphafold_settings(path: str | None) -> dict:
    """num_layer / num_recycle and the sizes from an AlphaFold config JSON (a bare ConfigDict
    dump, or the fixture's {"config": ...} wrapper)."""
    from protdp.weights.alphafold_config import monomer_overrides

    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
        model = data.get("config", data)["model"]
        return {"sm_layers": int(model["heads"]["structure_module"]["num_layer"]),
                "num_recycles": int(model["num_recycle"]),
                "overrides": monomer_overrides(model)}     # sizes, checked against the arrays
    except FileNotFoundError:
        raise InputError("AlphaFold config not found", path=path) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"not an AlphaFold model config ({type(exc).__name__}: {exc})",
                         path=path) from None


def _import_multimer(args) -> int:
    """AlphaFold-Multimer npz -> multimer checkpoint folder (`protdp.weights.multimer_checkpoint`)."""
    from protdp.weights.multimer_checkpoint import import_multimer, multimer_settings, save_multimer

    settings = multimer_settings(args.alphafold_config)
    for name in ("sm_layers", "num_recycles"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    model, provenance = import_multimer(args.source, **settings)
    check_import(model.state_dict(), args.source, args.out, "multimer")
    out = save_multimer(model, provenance, args.out)
    print(f"protdp weights: imported AlphaFold-Multimer {args.source} -> {out}")
    print(f"  {provenance['source_arrays']} source arrays, {provenance['protdp_parameters']:,} "
          f"values (source {provenance['source_parameters']:,}); structure module layers "
          f"{model.config.trunk.sm_layers}, recycles {model.config.trunk.num_recycles}, "
          f"templates {'on' if model.config.templates else 'off'}")
    return 0


def _import(args) -> int:
    from protdp.weights.convert import import_params, write_imported
    from protdp.weights.multimer_checkpoint import is_multimer_file

    if args.format == "alphafold" and Path(args.source).is_file() and \
            Path(args.source).suffix == ".npz" and is_multimer_file(args.source):
        return _import_multimer(args)
    settings = {"sm_layers": 8, "num_recycles": 3, **_alphafold_settings(args.alphafold_config)}
    if args.sm_layers is not None:
        settings["sm_layers"] = args.sm_layers
    if args.num_recycles is not None:
        settings["num_recycles"] = args.num_recycles
    imported = import_params(args.source, args.format, **settings)
    check_import(imported.model.state_dict(), args.source, args.out, "monomer")
    out = write_imported(imported, args.out)
    n_mapped = sum(len(v) for v in imported.mapped.values())
    print(f"protdp weights: imported {args.format} {args.source} -> {out}")
    print(f"  {len(imported.mapped)} source arrays mapped onto {n_mapped} protdp parameters "
          f"({imported.model.num_parameters():,} values; source {imported.source_parameters:,})")
    if imported.skipped:
        reasons = sorted(set(imported.skipped.values()))
        print(f"  {len(imported.skipped)} source arrays skipped: {'; '.join(reasons)}")
    given = args.sm_layers is not None or args.alphafold_config is not None
    print(f"  structure module layers {imported.config.sm_layers}, recycles "
          f"{imported.config.num_recycles}; details in {out / 'provenance.json'}")
    print(f"  note: these two are NOT in the arrays ({'as given' if given else 'AF2 defaults'});"
          f" a source trained with other values needs --sm-layers / --num-recycles (or "
          f"--alphafold-config), else its structures are wrong: check with `protdp weights "
          f"compare`")
    return 0


def _export(args) -> int:
    import torch

    from protdp.data.safeio import writable_output
    from protdp.fileio import replace_file
    from protdp.inference.checkpoint import load_model_checkpoint
    from protdp.weights.convert import export_arrays, export_openfold
    from protdp.weights.store import write_npz

    out = writable_output(args.out, "export", "zip", force=args.force,     # before the work
                          inputs=(args.checkpoint,))
    from protdp.weights.multimer_checkpoint import export_multimer_arrays, is_multimer_checkpoint
    if args.format == "alphafold" and is_multimer_checkpoint(args.checkpoint):   # issue 42
        arrays = export_multimer_arrays(args.checkpoint)
        try:
            write_npz(out, arrays)
        except OSError as exc:
            raise InputError(f"cannot write ({type(exc).__name__}: {exc})", path=out) from None
        print(f"protdp weights: exported AlphaFold-Multimer {args.checkpoint} -> {out}")
        return 0
    loaded = load_model_checkpoint(args.checkpoint)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        if args.format == "alphafold":
            write_npz(out, export_arrays(loaded.model))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            torch.save(export_openfold(loaded.model), tmp)
            replace_file(tmp, out)
    except (OSError, RuntimeError) as exc:     # torch reports unwritable paths as RuntimeError
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                         path=out) from None
    print(f"protdp weights: exported {loaded.path} ({loaded.weights} weights) as {args.format} -> {out}")
    return 0


def _compare(args) -> int:
    from protdp.weights.compare import run_compare
    from protdp.weights.compare_multimer import run_multimer_compare
    from protdp.weights.multimer_checkpoint import is_multimer_checkpoint

    if is_multimer_checkpoint(args.checkpoint):
        result = run_multimer_compare(args.checkpoint, args.features, args.reference,
                                      args.sampled_msa, dtype=args.dtype)
    elif args.sampled_msa is not None:
        raise InputError("--sampled-msa is for AlphaFold-Multimer checkpoints; this one is a "
                         "monomer (its MSA samples are the features' leading axis)",
                         path=args.checkpoint)
    else:
        result = run_compare(args.checkpoint, args.features, args.reference, dtype=args.dtype)
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0 if result["within_tolerance"] else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"import": _import, "export": _export, "compare": _compare}[args.command](args)
    except ValueError as exc:       # config validation (dataclass __post_init__)
        raise ConfigError(str(exc)) from None
