"""MSA search for targets without one: pyhmmer jackhmmer-style iterative search with AlphaFold2's
settings, over FASTA / FASTA.gz databases streamed in blocks (data floor: imports only
protdp.data, protdp.errors, protdp.config and the base modules)."""

from protdp.msa.database import SequenceDatabase, database_name, open_databases
from protdp.msa.run import SearchReport, a3m_path, search_provenance, search_targets
from protdp.msa.search import Query, QueryResult, search_database
from protdp.msa.settings import MGNIFY_MAX_SEQUENCES, UNIREF90_MAX_SEQUENCES, SearchSettings

__all__ = ["MGNIFY_MAX_SEQUENCES", "Query", "QueryResult", "SearchReport", "SearchSettings",
           "SequenceDatabase", "UNIREF90_MAX_SEQUENCES", "a3m_path", "database_name",
           "open_databases", "search_database", "search_provenance", "search_targets"]
