"""`mpirun -n 2 python tests/central_messages.py CASE`: rank 1 sends the learner (rank 0) one
step as an actor would, well formed or damaged as CASE says; rank 0 receives it with the real
`RemotePool` and prints what it got or the one-line error (tests/test_central.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ddrl.config import load_config
from ddrl.distributed.central import OBS_DATA, OBS_META, RemotePool, obs_meta_schema
from ddrl.errors import DdrlError

case = sys.argv[1]
cfg = load_config(Path(__file__).resolve().parents[1] / "jobs" / "cartpole.toml",
                  ["sync.mode=central", "algo.name=vtrace", "acting.n_sim=4", "central.groups=1"])
comm = MPI.COMM_WORLD
if comm.rank == 1:
    n = 4
    ids = np.array([0, 1, 2, 7 if case == "bad-id" else 3], np.float64)
    meta = obs_meta_schema(n, 0).pack(group=0, n=n, games=0, truncated=0, frames=n, t_sim=0,
                                      t_idle=0, t_round=0, rounds=0, env_ids=ids,
                                      reward=np.zeros(n), done=np.zeros(n),
                                      truncated_mask=np.zeros(n), whole=np.ones(n))
    obs = np.arange(n * 4, dtype=np.float32)
    data = obs.view(np.uint8)[: -8 if case == "short" else None]
    comm.Send(meta, 0, OBS_META)
    comm.Send(np.ascontiguousarray(data), 0, OBS_DATA)
else:
    pool = RemotePool(cfg, comm, 1, (4,), np.float32, 2, 1)
    try:
        step = pool.recv()
        print("received", step.env_ids.tolist(), step.obs.ravel().tolist())
    except DdrlError as exc:
        print(f"ddrl: error: {exc}")
