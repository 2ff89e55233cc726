"""The learner's actors in central mode (SEED RL): the simulators live on the actor ranks
(`distributed/central.py: RemotePool`) and the learner acts for
them. With the ba3c node its predictor thread is the inference batcher and unrolls, the FIFO
and the off-policy targets are the ba3c node's own; with DQN's node every remote simulator is
a stream of the learner's replay memory, as in SEED's R2D2, and the learner chooses their
epsilon-greedy actions batch by batch."""
from __future__ import annotations

import threading
import time

import numpy as np

from ddrl.acting import replay_frames_needed
from ddrl.acting.ba3c import BA3CActors
from ddrl.acting.dqn import DQNActors, Experience, Predict, epsilon_greedy
from ddrl.acting.policy import RecurrentState
from ddrl.config import Config
from ddrl.distributed.central import RemotePool
from ddrl.errors import DdrlError
from ddrl.learner import Learner


class _Remote:
    """What both central nodes add: the actor ranks' telemetry, and a stop that reaches a
    thread waiting for their observations."""
    _remote: RemotePool

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        return self._remote.pop_rows(updates)

    def close(self) -> None:
        # A thread may be waiting for observations: it must see the stop before the join.
        self._remote.stopping.set()
        super().close()


class CentralActors(_Remote, BA3CActors):
    def __init__(self, cfg: Config, learner: Learner, restart: int, pool: RemotePool):
        self._remote = pool
        super().__init__(cfg, learner, 0, restart, pools=[pool])


class RemoteSamplers:
    """DQN's samplers (`acting/dqn.py: Samplers`) over the actor ranks' simulators: each
    batch that arrives holds the steps of some of them, which enter the memory under the
    actions the learner chose for them last time, and gets its new actions at once."""

    def __init__(self, node: DQNActors, pool: RemotePool):
        self._node, self._pool = node, pool
        self.size = pool.num_envs
        self.n_actions, self.obs_shape, self.obs_dtype = pool.n_actions, pool.obs_shape, pool.obs_dtype
        # Simulators begin in the memory when their first observation arrives.
        self.first = (np.zeros(0, np.int64), np.zeros((0, *self.obs_shape), self.obs_dtype))
        self._begun = np.zeros(self.size, bool)
        self._actions = np.zeros(self.size, np.int32)
        # R2D2: each remote simulator's recurrent state lives here, where it is inferred for,
        # and the state its last action was chosen with, stored with the step it leads to.
        self._state = RecurrentState(self.size, node.learner.recurrent)
        self._acted_on = self._state.state()
        self._rng = node.rng("explore")
        self.stopped = threading.Event()

    def collect(self, rounds: int, predict: Predict | None, eps: float, acted_at: int
                ) -> Experience:
        """About `rounds` steps of every simulator: batches until that many transitions came."""
        out = Experience()
        while out.transitions < rounds * self.size and not self.stopped.is_set():
            t0 = time.perf_counter()
            step = self._pool.recv()
            t1 = time.perf_counter()
            ids = step.env_ids
            if not len(ids):
                break  # stopping
            new = ~self._begun[ids]
            if new.any():
                out.begins.append((ids[new], step.obs[new]))
                self._begun[ids[new]] = True
            known = ~new
            if known.any():
                reward = self._node.bootstrap_truncated(step, predict, self._state,
                                                        ids[step.truncated])
                out.steps.append((ids[known], self._actions[ids[known]], reward[known],
                                  step.done[known], np.full(int(known.sum()), acted_at),
                                  step.obs[known],
                                  *((self._acted_on[ids[known]],) if self._state.units else ())))
                out.frames += int(known.sum()) * self._pool.frames_per_step
            out.episodes += step.episodes
            if self._state.units:
                self._state.reset(step.done | new, ids)
                self._acted_on[ids] = self._state.state(ids)
            actions = epsilon_greedy(
                self._rng, step.obs, self.n_actions,
                predict and (lambda o, rows=ids: self._state.step(predict, o, rows=rows)), eps,
                infer_all=bool(self._state.units))
            self._actions[ids] = actions
            self._pool.send(actions)
            # Waiting for the actors is their simulation time as this node sees it.
            out.t_sim += t1 - t0
            out.t_predict += time.perf_counter() - t1
        return out

    def close(self) -> None:
        self._pool.close()


class CentralDQNActors(_Remote, DQNActors):
    def __init__(self, cfg: Config, learner: Learner, restart: int, pool: RemotePool):
        self._remote = pool
        streams = pool.num_envs
        if cfg.dqn.replay_frames < replay_frames_needed(cfg, streams):
            raise DdrlError(f"config key dqn.replay_frames: {cfg.dqn.replay_frames:,} frames "
                            f"cannot hold the stacks and {cfg.dqn.n_step}-step transitions of "
                            f"{streams} remote simulators (actor ranks x central.groups x "
                            "acting.n_sim), a stream each")
        super().__init__(cfg, learner, 0, restart, samplers=lambda node: RemoteSamplers(node, pool))


def central_actors(cfg: Config, learner: Learner, restart: int, pool: RemotePool) -> _Remote:
    """The learner's node for `acting.mode`."""
    node = CentralDQNActors if cfg.acting.mode == "dqn" else CentralActors
    return node(cfg, learner, restart, pool)
