"""The fixed levels a shadow node counts raw-output agreement at, shared by node and server.

Kept apart from `protos.bundle.agreement` (which needs numpy) so that the server's gates and
health store, which never load numpy, read the same levels the node counts at.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ABS_DIFF_LEVELS", "COSINE_LEVELS"]

COSINE_LEVELS: Final = (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)
"""Raw outputs: the cosine similarities a frame is counted at (`cosine_at_least`)."""
ABS_DIFF_LEVELS: Final = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
"""Raw outputs: the largest absolute differences a frame is counted at
(`abs_diff_at_most`). Fixed levels, so that a node need not know the rollout's gates:
the raw agreement gate's thresholds are chosen among them."""
