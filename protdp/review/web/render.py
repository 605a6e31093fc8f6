"""Templates, display filters and the pure layout math of the item page's plots.

Everything user-controlled reaches a page through Jinja2 autoescaping and the `show` filter
(`hygiene.display_text`: control characters escaped, bidi overrides made visible); lists use
`short` (truncated). Plots are SVG geometry computed here; the PAE heatmap is a PNG.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import jinja2
import numpy as np

from markupsafe import Markup, escape

from protdp.gating import AFDB_BAND_COLORS, AFDB_BAND_LABELS, AFDB_BANDS, REASON_TEXT
from protdp.gating.bands import band_index, band_ranges
from protdp.review.hygiene import display_text, truncate
from protdp.review.rows import iso

HERE = Path(__file__).resolve().parent.parent
PAE_MAX = 30.0                         # Å; the colour scale of AFDB's PAE plots


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(show=display_text, short=truncate,
                       showlines=lambda s: display_text(s, keep_newlines=True))
    env.globals.update(REASON_TEXT=REASON_TEXT, AFDB_BAND_LABELS=AFDB_BAND_LABELS,
                       AFDB_BANDS=AFDB_BANDS, AFDB_COLORS=AFDB_BAND_COLORS, iso=iso)
    return env


def _polylines(values: list, x, y) -> list[str]:
    """SVG polyline point lists; a missing (None) value breaks the line."""
    segments, current = [], []
    for i, v in enumerate(values):
        if v is None:
            if current:
                segments.append(" ".join(current))
            current = []
        else:
            current.append(f"{x(i):.1f},{y(float(v)):.1f}")
    if current:
        segments.append(" ".join(current))
    return segments


def series_plot(values: list, y_max: float, y_edges: list[float], *, width: int = 720,
                height: int = 220) -> dict:
    """Geometry of a per-residue line plot (x: residue, y: 0..y_max). Pure layout math."""
    left, right, top, bottom = 44, 10, 10, 30
    w, h = width - left - right, height - top - bottom
    n = len(values)

    def x(i: int) -> float:
        return left + (w / 2 if n < 2 else w * i / (n - 1))

    def y(v: float) -> float:
        return top + h * (y_max - min(max(v, 0.0), y_max)) / y_max

    step = max(1, round(n / 8)) if n else 1
    return {"width": width, "height": height, "left": left, "top": top, "plot_w": w,
            "plot_h": h, "segments": _polylines(values, x, y), "n": n, "bottom_y": top + h,
            "xticks": [{"x": x(i), "label": i + 1} for i in range(0, n, step)],
            "yticks": [{"y": y(v), "label": f"{v:g}"} for v in y_edges], "bands": [],
            "y": y}


def plddt_plot(plddt: list, width: int = 720, height: int = 220) -> dict:
    """Per-residue pLDDT with the AFDB band backgrounds."""
    edges = sorted({0.0, 100.0, *(lo for lo, _ in band_ranges().values())})
    plot = series_plot(plddt, 100.0, edges, width=width, height=height)
    y = plot.pop("y")
    plot["bands"] = [{"name": b, "color": AFDB_BAND_COLORS[b], "y": y(hi), "height": y(lo) - y(hi)}
                     for b, (lo, hi) in band_ranges().items()]
    return plot


def coverage_plot(coverage: list, rows_used: int | None, width: int = 720, height: int = 160
                  ) -> dict:
    """Per-residue MSA coverage (rows with a residue in that column)."""
    finite = [v for v in coverage if v is not None]
    y_max = float(max([rows_used or 0, *finite, 1]))
    plot = series_plot(coverage, y_max, [0.0, round(y_max / 2), y_max], width=width,
                       height=height)
    plot.pop("y")
    return plot


def residue_html(sequence: str | None, plddt: list, chains: list[dict] | None = None
                 ) -> Markup:
    """The sequence as one span per residue, classed by its pLDDT's AFDB band (bands computed
    at once with protdp.gating), a gap every 10 residues. Built here rather than in the
    template: a 1000-residue loop in Jinja costs tens of milliseconds per page. `chains` (a
    complex: `complex_view`'s, 1-based `first`): each chain's id and colour chip before its
    first residue, and each residue's chain and number within it (`data-chain`, `data-resi`:
    the structure files number every chain from 1), the gaps counted within the chain."""
    seq = sequence or ""
    n = max(len(seq), len(plddt))
    values = np.full(n, np.nan)                                            # [n]
    values[:len(plddt)] = [np.nan if v is None else float(v) for v in plddt]
    finite = np.isfinite(values)
    bands = np.full(n, "", dtype=object)
    if finite.any():
        bands[finite] = np.array(AFDB_BANDS, dtype=object)[band_index(values[finite])]
    starts = {c["first"] - 1: c for c in chains or ()}
    parts, chain_start, where = [], 0, ""
    for i in range(n):
        if i in starts:
            c, chain_start = starts[i], i
            cid = escape(display_text(str(c["chain_id"])))
            where = f' data-chain="{cid}"'           # the structure numbers each chain from 1
            parts.append(f'<span class="chain-label" data-chain="{cid}" title="chain {cid}: '
                         f'residues {c["first"]}-{c["last"]}"><svg class="chip" width="10" '
                         f'height="10" aria-hidden="true"><rect width="10" height="10" '
                         f'fill="{escape(c["color"])}"/></svg>{cid}</span>')
        aa = escape(display_text(seq[i] if i < len(seq) else "?"))
        cls = f"res band-{bands[i]}" if bands[i] else "res"
        value = f"{values[i]:.1f}" if finite[i] else "–"
        resi = i + 1 - chain_start
        label = f"{cid} {aa}{resi}" if where else f"{aa}{resi}"
        parts.append(f'<span class="{cls}"{where} data-resi="{resi}" title="{label} pLDDT '
                     f'{value}">{aa}</span>')
        if (i + 1 - chain_start) % 10 == 0:
            parts.append('<span class="gap"> </span>')
    return Markup("".join(parts))


PAE_DISPLAY_MAX = 512      # pixels per side of the PAE image; larger maps are block-averaged


def downsample_pae(arr: np.ndarray, size: int = PAE_DISPLAY_MAX) -> np.ndarray:
    """[L, L] -> [ceil(L/f), ceil(L/f)] block means with f = ceil(L / size) (edge blocks
    averaged over the residues they hold), so a long chain's map stays a small image."""
    n = arr.shape[0]
    f = -(-n // size)
    if f <= 1:
        return arr
    m = -(-n // f)
    padded = np.full((m * f, m * f), np.nan)
    padded[:n, :n] = arr
    return np.nanmean(padded.reshape(m, f, m, f), axis=(1, 3))               # [m, m]


@functools.lru_cache(maxsize=32)
def _pae_png(path: str, _mtime_ns: int, _size: int) -> bytes | None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import image

    try:
        pae = json.loads(Path(path).read_text()).get("pae")
    except (OSError, ValueError, AttributeError):
        return None
    if not pae:
        return None
    arr = np.array(pae, dtype=float)                      # [L, L] Å
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] > 10_000:
        return None
    arr = downsample_pae(np.nan_to_num(arr, nan=PAE_MAX))
    buf = io.BytesIO()
    image.imsave(buf, arr, vmin=0.0, vmax=PAE_MAX, cmap="Greens_r", format="png")
    return buf.getvalue()


def pae_png(scores_path: Path | None) -> bytes | None:
    """The PAE heatmap of a prediction's scores.json (None without the PAE head)."""
    if scores_path is None:
        return None
    st = scores_path.stat()
    return _pae_png(str(scores_path), st.st_mtime_ns, st.st_size)


# chain colours of a complex in the 3D view and the PAE overlay (colour-blind-safe Okabe-Ito
# order, then Tableau 10; repeated past 16 chains)
CHAIN_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                "#000000", "#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948",
                "#9C755F", "#BAB0AC")
PAE_IMAGE_PX = 360                     # side of the PAE image on the item page


def complex_view(scores: dict, size: int = PAE_IMAGE_PX) -> dict | None:
    """What the workbench shows of a complex (scores with ≥ 2 `chains`, issue 32), else None:
    each chain with its colour and 1-based residue range, the chain-pair ipTM as rows, and
    the PAE overlay geometry on a `size` px image of the whole complex: a line at every chain
    boundary and a rectangle around every interface (off-diagonal chain-pair) block."""
    chains = scores.get("chains")
    if not isinstance(chains, list) or len(chains) < 2:
        return None
    try:
        ranges = [(str(c["chain_id"]), int(c["start"]), int(c["end"])) for c in chains]
    except (KeyError, TypeError, ValueError):
        return None
    n = ranges[-1][2]
    if n <= 0 or any(not 0 <= s < e <= n for _, s, e in ranges):
        return None
    scale = size / n
    ids = [c for c, _, _ in ranges]
    pairs = scores.get("chain_pair_iptm") if isinstance(scores.get("chain_pair_iptm"), dict) \
        else {}
    return {
        "interface_rows": interface_rows(scores, ids),
        "chains": [{"chain_id": c, "color": CHAIN_COLORS[k % len(CHAIN_COLORS)],
                    "first": s + 1, "last": e} for k, (c, s, e) in enumerate(ranges)],
        "pair_rows": [{"chain_id": a, "values": [(pairs.get(a) or {}).get(b) for b in ids]}
                      for a in ids],
        "ids": ids,
        "size": size,
        "boundaries": [round(s * scale, 2) for _, s, _ in ranges[1:]],
        "interface_blocks": [{"x": round(sb * scale, 2), "y": round(sa * scale, 2),
                              "w": round((eb - sb) * scale, 2), "h": round((ea - sa) * scale, 2),
                              "label": f"{a}-{b}"}
                             for a, sa, ea in ranges for b, sb, eb in ranges if a != b],
    }


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def interface_rows(scores: dict, ids: list[str]) -> list[dict]:
    """The chain-pair table above the fold (issue 43): one row per unordered pair, from the
    max rows of `interface_scores` (ipSAE, pDockQ2, LIS, actifpTM; `protdp.interface`) with
    the pair's ipTM (`chain_pair_iptm`) and interface PAE (the mean of both off-diagonal
    blocks of `chain_pair_pae`). Values that are missing or not numbers are None."""
    rows = [r for r in scores.get("interface_scores") or () if isinstance(r, dict)
            and r.get("type") == "max" and r.get("chain_1") in ids and r.get("chain_2") in ids]
    iptm = scores.get("chain_pair_iptm") if isinstance(scores.get("chain_pair_iptm"), dict) \
        else {}
    pae = scores.get("chain_pair_pae") if isinstance(scores.get("chain_pair_pae"), dict) else {}
    out = []
    for r in rows:
        a, b = str(r["chain_1"]), str(r["chain_2"])
        both = [_num((pae.get(x) or {}).get(y)) for x, y in ((a, b), (b, a))]
        out.append({"pair": f"{a}-{b}", "chain_1": a, "chain_2": b,
                    "iptm": _num((iptm.get(a) or {}).get(b)), "ipsae": _num(r.get("ipsae")),
                    "pdockq2": _num(r.get("pdockq2")), "lis": _num(r.get("lis")),
                    "actifptm": _num(r.get("actifptm")),
                    "interface_pae": sum(both) / 2 if None not in both else None})
    return out
