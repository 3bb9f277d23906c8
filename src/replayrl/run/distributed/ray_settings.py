"""The Ray runtime's settings, the `ray` section of a config (`runtime: ray`): where the
cluster is, what each actor asks of it, and how weights reach the generators. The runtime
declares the section in its registry entry (run/runtimes.py); the schema validates it under
`ray` and code reads it with `ray_settings(cfg)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from replayrl.config.section import Section

if TYPE_CHECKING:
    from replayrl.config.schema import Config

SECTION = "ray"


class RayConfig(Section):
    """`runtime: ray`: where and how the actors are placed."""

    address: str | None = None  # None: start a local Ray instance; "auto" or host:port: join
    num_cpus: int | None = Field(None, ge=1)  # local instance only; None = all cores
    generator_num_cpus: float = Field(1.0, ge=0, description="CPUs per generator actor")
    generator_num_gpus: float = Field(0.0, ge=0, description="GPUs per generator actor")
    learner_num_cpus: float = Field(1.0, ge=0, description="CPUs per learner actor")
    learner_num_gpus: float = Field(0.0, ge=0, description="GPUs per learner actor")
    buffer_num_cpus: float = Field(0.0, ge=0, description="CPUs of the buffer actor")
    # custom Ray resources per role (`ray start --resources='{"gen": 4}'`): pin roles to nodes
    generator_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per generator actor"
    )
    learner_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per learner actor"
    )
    buffer_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per buffer shard actor"
    )
    # a run the cluster's nodes cannot hold is refused at start, naming what is missing;
    # with a value the driver waits up to that long for nodes to join (an autoscaler)
    placement_timeout: float | None = Field(
        None,
        ge=0,
        description="seconds to wait for the cluster to provide the actors' resources "
        "(None: refuse at once a run it cannot place)",
    )
    # how weights reach the generator actors (run/distributed/weight_sync.py); auto: a broadcast
    # (NCCL) where learner and generators hold GPUs, the object store otherwise
    weight_sync: Literal["auto", "object_store", "broadcast"] = Field(
        "auto", description="learner -> generator weight path: auto, object_store or broadcast"
    )


def ray_settings(cfg: Config) -> RayConfig:
    """The config's `ray` section."""
    return cfg.section(SECTION, RayConfig)
