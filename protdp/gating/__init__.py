"""The confidence gate, below inference and review: policy, AFDB bands, reason texts, routing.

`protdp.inference` routes every prediction with `route()`; `protdp.review` and `protdp.safety`
read the same bands, reasons and policy from here, so neither needs the predictor.
The gate's numbers live in one place, `protdp/configs/gating.yaml` (the `GatePolicy` defaults).
"""

from protdp.gating.bands import AFDB_BAND_COLORS, AFDB_BAND_LABELS, AFDB_BANDS, afdb_bands, band_of
from protdp.gating.policy import (CalibratedGatePolicy, GatePolicy, load_calibrated_policy,
                                  load_gate_policy, load_reviewed_policy)
from protdp.gating.reasons import REASON_TEXT, ROUTES
from protdp.gating.route import GateDecision, route, sequence_complexity

__all__ = ["AFDB_BANDS", "AFDB_BAND_COLORS", "AFDB_BAND_LABELS", "CalibratedGatePolicy",
           "GateDecision", "GatePolicy", "REASON_TEXT", "ROUTES", "afdb_bands", "band_of",
           "load_calibrated_policy", "load_gate_policy", "load_reviewed_policy", "route",
           "sequence_complexity"]
