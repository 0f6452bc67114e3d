"""The ISR, high-watermark and leader-epoch decisions, shared with the broker: see gregor.common.isr."""

from gregor.common.isr import *  # noqa: F401,F403
from gregor.common.isr import (EpochEntries, FollowerFetchState, IsrChangePropagation,  # noqa: F401
                               TruncationDecision)
