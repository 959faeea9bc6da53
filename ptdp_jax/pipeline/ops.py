"""One op of one stage at one tick of a lockstep pipeline schedule, and the executor's op codes.

Shared by the schedule builders (schedule.py, zero_bubble.py) and the executor.
"""
from __future__ import annotations

from dataclasses import dataclass

# executor op codes; BWD_INPUT / BWD_WEIGHT are the zero-bubble split of a backward into B (the
# input gradient, sent upstream) and W (the weight gradient, which can wait)
IDLE, FWD, BWD_UPPER, BWD_LOWER, BWD_FULL, BWD_INPUT, BWD_WEIGHT = range(7)
_OP_CODE = {("F", "full"): FWD, ("B", "upper"): BWD_UPPER, ("B", "lower"): BWD_LOWER,
            ("B", "full"): BWD_FULL, ("B", "input"): BWD_INPUT, ("W", "weight"): BWD_WEIGHT}


@dataclass(frozen=True)
class Op:
    """One op of one stage at one tick."""
    kind: str        # 'F', 'B' or 'W' (zero-bubble weight gradient)
    microbatch: int
    chunk: int       # GLOBAL chunk index in [0, p*v)
    half: str        # 'full' for F and unsplit B; 'upper' or 'lower' for split B;
                     # 'input' for a zero-bubble B, 'weight' for its W

    @property
    def completes_backward(self) -> bool:
        """True for the op that finishes the input gradient (and sends it upstream)."""
        return self.kind == "B" and self.half in ("lower", "full", "input")
