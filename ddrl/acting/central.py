"""The learner's actors in central mode (SEED RL): the ba3c node with one pool whose
simulators live on the actor ranks (`distributed/central.py: RemotePool`, handed in by the
entry point). Its predictor thread is the inference batcher; unrolls, the FIFO and the
off-policy targets are the ba3c node's own."""
from __future__ import annotations

from ddrl.acting.ba3c import BA3CActors
from ddrl.config import Config
from ddrl.learner import Learner


class CentralActors(BA3CActors):
    def __init__(self, cfg: Config, learner: Learner, restart: int, pool):
        self._remote = pool
        super().__init__(cfg, learner, 0, restart, pools=[pool])

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        return self._remote.pop_rows(updates)

    def close(self) -> None:
        # The predictor may be waiting for observations: it must see the stop before the join.
        self._remote.stopping.set()
        super().close()
