"""Can the Ray cluster hold a run's actors? Checked at start, so that a run asking for what
no node has (a GPU on a machine without one) is refused naming what is missing, instead of
waiting forever in Ray's queue ("No available node types can fulfill resource request").

A run's actors: T learner ranks, T buffer shards (one per learner) and W generators, each
with its `ray.*` requests; each actor must fit on one node. The check compares them with the
alive nodes' total resources (not what is free now: actors of other jobs end, a missing GPU
never appears). `ray.placement_timeout` is for clusters that grow (an autoscaler): the
driver then waits up to that many seconds for nodes that can hold the run, and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from replayrl.config.schema import Config
from replayrl.run.distributed.ray_settings import ray_settings

Resources = dict[str, float]
_EPS = 1e-9  # fractional requests (0.25 CPU) add up with rounding error


def actor_requests(cfg: Config) -> list[tuple[str, Resources]]:
    """(role, resources) of every actor the run starts: learners, buffer shards, generators."""
    rc, learners, generators = ray_settings(cfg), cfg.workers.learners, cfg.workers.generators

    def ask(cpus: float, gpus: float, custom: dict[str, float]) -> Resources:
        wanted = {"CPU": cpus, "GPU": gpus, **custom}
        return {k: float(v) for k, v in wanted.items() if v > 0}

    learner = ask(rc.learner_num_cpus, rc.learner_num_gpus, rc.learner_resources)
    shard = ask(rc.buffer_num_cpus, 0.0, rc.buffer_resources)
    generator = ask(rc.generator_num_cpus, rc.generator_num_gpus, rc.generator_resources)
    return (
        [("learner", learner)] * learners
        + [("buffer shard", shard)] * learners
        + [("generator", generator)] * generators
    )


def _text(r: Resources) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(r.items())) or "no resources"


def _total(rs: list[Resources]) -> Resources:
    out: Resources = {}
    for r in rs:
        for k, v in r.items():
            out[k] = out.get(k, 0.0) + v
    return out


def shortfall(actors: list[tuple[str, Resources]], nodes: list[Resources]) -> str | None:
    """Why `actors` cannot all be placed on `nodes` (each actor on one node; the largest
    first, each on the first node with room), or None when they can."""
    free = [dict(n) for n in nodes]
    unplaced: list[tuple[str, Resources]] = []
    for role, need in sorted(actors, key=lambda a: -sum(a[1].values())):
        for node in free:
            if all(node.get(k, 0.0) + _EPS >= v for k, v in need.items()):
                for k, v in need.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            unplaced.append((role, need))
    if not unplaced:
        return None
    asked, has = _total([r for _, r in actors]), _total(nodes)
    missing = {k: v - has.get(k, 0.0) for k, v in asked.items() if v > has.get(k, 0.0) + _EPS}
    roles: dict[str, int] = {}
    for role, _ in actors:
        roles[role] = roles.get(role, 0) + 1
    each = "; ".join(
        f"{n} {role}{'s' if n > 1 else ''}: {_text(dict(actors)[role])} each"
        for role, n in roles.items()
    )
    if missing:
        why = f"missing {_text(missing)}"
    else:  # enough in total, but no single node holds an actor
        role, need = unplaced[0]
        why = f"no node has room for a {role} ({_text(need)}) beside the other actors"
    return (
        f"the Ray cluster cannot place this run: its actors ask for {_text(asked)} ({each}) "
        f"and the cluster's {len(nodes)} node(s) have {_text({k: has.get(k, 0.0) for k in asked})}"
        f": {why}. Lower the ray.* "
        "requests or workers.generators / workers.learners, join a larger cluster "
        "(ray.address), or set ray.placement_timeout=SECONDS to wait for nodes to join"
    )


def check_placement(
    cfg: Config,
    nodes: Callable[[], list[Resources]],
    log: Callable[[str], None],
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Refuse (ValueError, the CLI's one line and exit 2) a run `nodes()` cannot hold; with
    `ray.placement_timeout` wait up to that long for the cluster to grow, saying so."""
    actors = actor_requests(cfg)
    why = shortfall(actors, nodes())
    timeout = ray_settings(cfg).placement_timeout
    if why is None:
        return
    if not timeout:
        raise ValueError(why)
    log(f"waiting up to {timeout:g} s (ray.placement_timeout) for the Ray cluster to grow: {why}")
    deadline = clock() + timeout
    while clock() < deadline:
        sleep(min(2.0, max(0.0, deadline - clock())))
        why = shortfall(actors, nodes())
        if why is None:
            log("the Ray cluster can now place the run")
            return
    raise ValueError(f"after waiting {timeout:g} s (ray.placement_timeout), {why}")


def alive_nodes(ray: Any) -> list[Resources]:
    """Each alive node's total resources (Ray's own bookkeeping keys left out)."""
    out = []
    for node in ray.nodes():
        if node.get("Alive"):
            res = node.get("Resources") or {}
            out.append({k: float(v) for k, v in res.items() if not k.startswith("node:")})
    return out
