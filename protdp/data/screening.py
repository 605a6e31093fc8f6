"""Sequence-of-concern screening shared by the data filter and the predictor.

A user supplies a FASTA of sequences of concern. A query is flagged when it shares an exact
k-mer (default k = 20, i.e. a 20-residue identical stretch) with a listed sequence; entries
shorter than k are matched as whole sequences. Hits are reported as maximal exact segments.
An optional `phmmer` mode (pyhmmer, HMMER3) also catches diverged homologs by E-value.

    screen = ScreeningList.from_fasta("configs/screening/demo_list.fasta", k=20)
    screen.hits("MQIFVKTLTGKTITLEVEPSD...")  # -> [Hit(entry='sp|P0CG48|UBC_HUMAN', ...)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from protdp.errors import ConfigError, InputError

MODES = ("kmer", "phmmer")


@dataclass(frozen=True)
class Hit:
    """One match of a query against a listed sequence (0-based, half-open coordinates)."""
    entry: str            # listed sequence id (first word of its FASTA header)
    query_start: int
    query_end: int
    entry_start: int
    entry_end: int
    method: str           # 'kmer' or 'phmmer'
    evalue: float = 0.0   # phmmer E-value (0 for exact k-mer matches)

    @property
    def length(self) -> int:
        return self.query_end - self.query_start


def _clean(seq: str) -> str:
    return re.sub(r"[^A-Z]", "", seq.upper())


def read_fasta(path: str | Path) -> list[tuple[str, str]]:
    """(id, sequence) records; clear InputError naming the file and line on malformed input."""
    from protdp.data.safeio import os_reason, read_text

    path = Path(path)
    try:           # a regular UTF-8 text file: binary data is one line (UnicodeDecodeError)
        text = read_text(path)
    except OSError as exc:
        raise InputError(f"cannot read screening list: {os_reason(exc)}", path=path) from None
    records: list[list] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(";") or line.startswith("#"):
            continue
        if line.startswith(">"):
            name = line[1:].split()[0] if line[1:].strip() else f"entry{len(records) + 1}"
            records.append([name, [], lineno])
        elif not records:
            raise InputError("sequence before the first '>' header", path=path, line=lineno)
        elif not re.fullmatch(r"[A-Za-z*\-. ]+", line):
            raise InputError("unexpected characters in sequence", path=path, line=lineno)
        else:
            records[-1][1].append(line)
    out = []
    for name, parts, lineno in records:
        seq = _clean("".join(parts))
        if not seq:
            raise InputError(f"entry '{name}' has no sequence", path=path, line=lineno)
        out.append((name, seq))
    if not out:
        raise InputError("screening list has no entries", path=path)
    return out


class ScreeningList:
    """Exact long k-mer matching (plus optional phmmer) against sequences of concern."""

    def __init__(self, entries: list[tuple[str, str]], k: int = 20, mode: str = "kmer",
                 evalue: float = 1e-5, source: str = "<list>"):
        if k < 5:
            raise ConfigError(f"screening k must be >= 5 (got {k}); short k-mers match by chance")
        if mode not in MODES:
            raise ConfigError(f"screening mode must be one of {MODES}, got '{mode}'")
        self.entries = [(name, _clean(seq)) for name, seq in entries]
        self.k, self.mode, self.evalue, self.source = k, mode, evalue, source
        self._index: dict[str, list[tuple[int, int]]] = {}      # k-mer -> [(entry, pos)]
        self._short: list[int] = []                              # entries shorter than k
        for e, (_, seq) in enumerate(self.entries):
            if len(seq) < k:
                self._short.append(e)
            for p in range(len(seq) - k + 1):
                self._index.setdefault(seq[p:p + k], []).append((e, p))

    @classmethod
    def from_fasta(cls, path: str | Path, k: int = 20, mode: str = "kmer",
                   evalue: float = 1e-5) -> "ScreeningList":
        return cls(read_fasta(path), k=k, mode=mode, evalue=evalue, source=str(path))

    def __len__(self) -> int:
        return len(self.entries)

    def __getstate__(self):   # keep pickles small for multiprocessing: rebuild the index
        return {"entries": self.entries, "k": self.k, "mode": self.mode,
                "evalue": self.evalue, "source": self.source}

    def __setstate__(self, state):
        self.__init__(state["entries"], state["k"], state["mode"], state["evalue"],
                      state["source"])

    def _kmer_hits(self, q: str) -> list[Hit]:
        k = self.k
        diag: dict[tuple[int, int], list[int]] = {}   # (entry, entry_pos - query_pos) -> [qpos]
        for i in range(len(q) - k + 1):
            for e, p in self._index.get(q[i:i + k], ()):
                diag.setdefault((e, p - i), []).append(i)
        hits = []
        for (e, d), starts in sorted(diag.items()):
            run_start = prev = starts[0]
            for s in starts[1:] + [None]:
                if s is not None and s == prev + 1:
                    prev = s
                    continue
                hits.append(Hit(self.entries[e][0], run_start, prev + k, run_start + d,
                                prev + k + d, "kmer"))
                if s is not None:
                    run_start = prev = s
        for e in self._short:
            name, seq = self.entries[e]
            start = q.find(seq)
            while start >= 0:
                hits.append(Hit(name, start, start + len(seq), 0, len(seq), "kmer"))
                start = q.find(seq, start + 1)
        return hits

    def _phmmer_hits(self, q: str) -> list[Hit]:
        import pyhmmer
        alphabet = pyhmmer.easel.Alphabet.amino()
        query = pyhmmer.easel.TextSequence(name=b"query", sequence=q).digitize(alphabet)
        targets = pyhmmer.easel.DigitalSequenceBlock(alphabet, [
            pyhmmer.easel.TextSequence(name=name.encode(), sequence=seq).digitize(alphabet)
            for name, seq in self.entries])
        hits = []
        for top in pyhmmer.hmmer.phmmer([query], targets, cpus=1, E=self.evalue):
            for hit in top:
                if hit.evalue > self.evalue:
                    continue
                for dom in hit.domains:
                    ali = dom.alignment
                    name = hit.name.decode() if isinstance(hit.name, bytes) else hit.name
                    hits.append(Hit(name, ali.hmm_from - 1, ali.hmm_to, ali.target_from - 1,
                                    ali.target_to, "phmmer", float(hit.evalue)))
        return hits

    def hits(self, sequence: str) -> list[Hit]:
        """All matches of `sequence` against the list (empty list = clean)."""
        q = _clean(sequence)
        found = self._kmer_hits(q)
        if self.mode == "phmmer" and q:
            found += self._phmmer_hits(q)
        return found

    def is_flagged(self, sequence: str) -> bool:
        return bool(self.hits(sequence))
