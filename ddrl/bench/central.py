"""`ddrl bench central JOB.toml [--hosts 2 4] [--rates 1gbit 10gbit] [--seconds S]`: central
inference against per-rank inference on the same simulated hosts (ddrl/bench/simhosts.py).

For each link rate and host count h: the job in `sync.mode = "central"` with the learner on
host 1 and one actor rank on each other host, then the same job with h all-reduce ranks, one
per host, each inferring for its own simulators. Printed per run: frames/s; for central mode
the bytes per frame on the wire (observations and headers in, actions out, as the learner
counted them), the learner's mean inference batch and the time it spends gathering one, the
actors' mean round trip (a step sent to its actions) and their idle share of an update, and
the learner's busy share (inference and training per update). Per-rank mode's bytes per frame
are its gradient's all-reduce traffic, 2 (h - 1) / h of the gradient per rank and update.

Then the model of central mode (`CentralModel`), fitted on each rate's first central run,
checked against the others and used to predict `--predict` actor hosts.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ddrl.errors import DdrlError


@dataclass(frozen=True)
class CentralModel:
    """Central mode's frames/s as the least of three rates, each fitted on one run (`fit`):
    - the actors': each actor host's simulators alone, its idle time (waiting for actions)
      taken out;
    - the learner's: the frames/s at which it is busy all the time;
    - the learner's link: its rate over the bytes each frame puts on it (observations in,
      actions out; counted both ways, so a little pessimistic for a full-duplex link).
    On CPU cores the learner is the limit; an accelerator raises its rate (not measured here:
    `learner_fps` is what it would have to reach)."""
    actor_fps: float
    learner_fps: float
    bytes_per_frame: float

    @classmethod
    def fit(cls, measured: dict[str, float], actor_hosts: int) -> "CentralModel":
        """From one run, which reproduces it: the side that waits less is the limit at its
        measured rate. Actors idle longer than the learner wait for it, so the learner's rate
        is the run's (its busy share, inference and training alone, leaves out its gathering
        and the hand-offs between its threads); otherwise the actors' is."""
        fps, idle, busy = measured["frames_per_s"], measured["actor_idle"], measured["learner_busy"]
        actor_fps = fps / actor_hosts / max(1.0 - idle, 1e-3)
        learner_fps = fps / max(busy, 1e-3)
        if idle > 1.0 - busy:
            learner_fps = fps
        else:
            actor_fps = fps / actor_hosts
        return cls(actor_fps, learner_fps, measured["bytes_per_frame"])

    def frames_per_s(self, actor_hosts: int, link_bytes_per_s: float) -> tuple[float, str]:
        """The predicted rate and what limits it."""
        limits = {"actors": actor_hosts * self.actor_fps, "learner": self.learner_fps,
                  "link": link_bytes_per_s / self.bytes_per_frame}
        limit = min(limits, key=limits.get)
        return limits[limit], limit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TOML job file")
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4],
                   help="simulated hosts per run, the learner's included (default 2 4)")
    p.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"],
                   help="link rates (tc syntax; default 1gbit 10gbit)")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="measured seconds per run, after a warm-up (default 30)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable)")
    p.add_argument("--predict", type=int, nargs="+", default=[64],
                   help="actor hosts to predict central mode's frames/s for (default 64)")


def measure(job: str, sets: list[str], hosts: int, rate: str, seconds: float,
            central: bool) -> dict[str, float]:
    from ddrl.bench.runs import timed_tables
    from ddrl.bench.simhosts import SimulatedHosts

    mode = ["sync.mode=central", "acting.mode=ba3c"] if central else ["sync.mode=allreduce",
                                                                      "sync.backend=mpi"]
    tables = ("train", "ranks", "inference") if central else ("train",)
    with SimulatedHosts(hosts, rate=rate) as net:
        rows, warmup = timed_tables(net.mpirun([1] * hosts), job, [*sets, *mode], seconds,
                                    tables, f"the {'central' if central else 'per-rank'} run "
                                            f"on {hosts} hosts")
    train = rows["train"]
    if len(train) < 3:
        raise DdrlError(f"fewer than 3 updates after {warmup:.0f} s of warm-up: raise --seconds")
    span = train["wall_time"][-1] - train["wall_time"][0]
    updates = train["update"][-1] - train["update"][0]
    period = span / updates
    out = {"frames_per_s": (train["frames"][-1] - train["frames"][0]) / span,
           "updates_per_s": updates / span}
    if central:
        ranks, inference = rows["ranks"], rows["inference"]
        actors, learner = ranks[ranks["rank"] > 0], ranks[ranks["rank"] == 0]
        wire = float((actors["bytes_in"] + actors["bytes_out"]).sum())
        out.update(
            bytes_per_frame=wire / max(float(actors["frames"].sum()), 1.0),
            batch=inference["observations"].sum() / max(inference["batches"].sum(), 1),
            t_gather_ms=1e3 * inference["t_gather"].sum() / max(inference["batches"].sum(), 1),
            round_ms=1e3 * float(actors["t_round"].mean()),
            actor_idle=float(actors["t_wait"].mean()) / period,
            learner_busy=float(learner["t_predict"].mean() + train["t_train"].mean()) / period,
            learner_mib=float(learner["peak_rss_mb"].max()))
    return out


def run(args: argparse.Namespace) -> int:
    from ddrl.bench.scaling import gradient_bytes
    from ddrl.bench.simhosts import available, parse_rate
    from ddrl.placement import load_job

    reason = available()
    if reason:
        raise DdrlError(f"bench central: {reason}")
    for rate in args.rates:
        parse_rate(rate)
    if args.seconds <= 0 or any(h < 2 for h in args.hosts):
        raise DdrlError("bench central: need --seconds > 0 and --hosts >= 2 (a learner and an "
                        "actor)")
    cfg = load_job(args.job, [*args.set, "acting.mode=ba3c"])
    nbytes = gradient_bytes(cfg)
    print(f"ddrl bench central {args.job}: {cfg.env.id}, {cfg.model.arch}, {cfg.algo.name}, "
          f"{cfg.acting.n_sim} simulators per group, {cfg.central.groups} groups per actor; "
          f"gradient {nbytes / 2**20:.2f} MB; {args.seconds:g} s per run", flush=True)
    print(f"{'link':>8s} {'hosts':>5s} {'mode':>9s} {'frames/s':>9s} {'B/frame':>9s} "
          f"{'batch':>6s} {'gather ms':>9s} {'round ms':>8s} {'actor idle':>10s} "
          f"{'learner busy':>12s} {'learner MiB':>11s} {'model':>7s}", flush=True)
    models = {}
    for rate in args.rates:
        for hosts in args.hosts:
            for central in (True, False):
                m = measure(args.job, args.set, hosts, rate, args.seconds, central)
                if central:
                    model = models.setdefault(rate, CentralModel.fit(m, hosts - 1))
                    predicted, _ = model.frames_per_s(hosts - 1, parse_rate(rate) / 8)
                    detail = (f"{m['bytes_per_frame']:9.0f} {m['batch']:6.1f} "
                              f"{m['t_gather_ms']:9.2f} {m['round_ms']:8.2f} "
                              f"{m['actor_idle']:10.0%} {m['learner_busy']:12.0%} "
                              f"{m['learner_mib']:11.0f} {predicted:7,.0f}")
                else:
                    per_update = 2 * (hosts - 1) / hosts * nbytes * hosts
                    frames_per_update = m["frames_per_s"] / m["updates_per_s"]
                    detail = f"{per_update / frames_per_update:9.0f} {'-':>6s} {'-':>9s} " \
                             f"{'-':>8s} {'-':>10s} {'-':>12s}"
                print(f"{rate:>8s} {hosts:5d} {'central' if central else 'per-rank':>9s} "
                      f"{m['frames_per_s']:9,.0f} {detail}", flush=True)
    print("\nmodel (fitted on each rate's first central run; 'model' above is its prediction "
          "for each run):")
    for rate, model in models.items():
        print(f"  {rate}: one actor host {model.actor_fps:,.0f} frames/s when never waiting, "
              f"learner {model.learner_fps:,.0f} frames/s when always busy, "
              f"{model.bytes_per_frame:,.0f} B/frame")
        for hosts in args.predict:
            fps, limit = model.frames_per_s(hosts, parse_rate(rate) / 8)
            print(f"    {hosts} actor hosts: {fps:,.0f} frames/s, limited by the {limit}; the "
                  f"actors alone would give {hosts * model.actor_fps:,.0f}, the link "
                  f"{parse_rate(rate) / 8 / model.bytes_per_frame:,.0f}")
    return 0
