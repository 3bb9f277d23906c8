"""The vLLM backends' settings, the `vllm` section of a config: the in-process engine's
(`rollout.backend=vllm`) and, under `vllm.server`, where a vLLM server in a process of its own
listens (`rollout.backend=vllm_server`). Both backends declare this section in their registry
entries (rollout/generation/backends.py); the schema validates it under `vllm` and code reads
it with `vllm_settings(cfg)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from replayrl.config.section import Section

if TYPE_CHECKING:
    from replayrl.config.schema import Config

SECTION = "vllm"


class VLLMServerConfig(Section):
    """A vLLM server in a process of its own (rollout.backend = vllm_server; start it with
    `replayrl serve-vllm`): where it listens, how long to wait for it, and the folder both
    processes see that weight pushes go through (TRL's vllm_mode="server")."""

    # the dev-mode endpoints the weight push uses (/collective_rpc) run any worker method:
    # keep the server on a private interface
    host: str = Field("127.0.0.1", description="the vLLM server's host")
    port: int = Field(8000, ge=1, le=65535, description="the vLLM server's port")
    base_url: str | None = Field(
        None, description="the server's URL (http://host:port); wins over host and port"
    )
    # None: the run's model folder (model.path, or the built-in model's warm start), as
    # `replayrl serve-vllm` serves it
    model: str | None = Field(None, description="the model name the server must serve")
    # None: a folder of the run's own in /dev/shm (a server on the same machine); a server on
    # another machine needs a folder both see, under the same path
    weights_dir: str | None = Field(
        None, description="shared folder that pushed weights are written to for the server"
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description="seconds one request to the server may take"
    )
    connect_timeout_s: float = Field(
        240.0, ge=0, description="seconds to wait for the server at start (TRL's 240)"
    )
    max_concurrent_requests: int = Field(
        32, ge=1, description="prompts in flight to the server at once (one request each)"
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"vllm.server.base_url={v!r}: give a URL such as http://host:8000")
        return v

    @property
    def url(self) -> str:
        """The server's URL, without a trailing slash."""
        return (self.base_url or f"http://{self.host}:{self.port}").rstrip("/")


class VLLMConfig(Section):
    """vLLM engine settings (rollout.backend = vllm; GPU only; vllm_server: the server's
    address under `vllm.server`)."""

    gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="share of the GPU's memory vLLM reserves (weights + KV)"
    )
    # one GPU per engine: the in-process weight push reaches a single worker's model only
    tensor_parallel_size: int = Field(1, ge=1, le=1, description="1 (TP > 1 is not supported)")
    # CUDA graphs stay valid across weight pushes: load_weights copies into the captured
    # parameters in place (TRL's colocate mode does the same with graphs on)
    enforce_eager: bool = Field(False, description="no CUDA graph capture (slower decoding)")
    # None: the longest kept prompt + rollout.max_new_tokens (a small KV reservation)
    max_model_len: int | None = Field(None, ge=1, description="engine context length")
    # None: train.seed + the generator worker's index (each seed of a sweep and each worker
    # draws its own sampling noise)
    seed: int | None = Field(None, description="engine sampling seed; None: train.seed + worker")
    # truncated importance sampling of the engine / trainer mismatch (precision.
    # truncated_is_cap): with vLLM the sampler's kernels differ from the learner's, so this
    # cap applies unless precision.truncated_is_cap is set; null: off
    truncated_is_cap: float | None = Field(
        2.0, gt=0, description="with vLLM: truncated IS cap C for the engine/trainer mismatch"
    )
    server: VLLMServerConfig = VLLMServerConfig()

    @field_validator("tensor_parallel_size", mode="before")
    @classmethod
    def _single_gpu_engine(cls, v: Any) -> Any:
        if isinstance(v, int) and v > 1:
            raise ValueError(
                f"vllm.tensor_parallel_size={v}: only 1 is supported (policy weights are pushed "
                "into one in-process engine worker); use a model that fits one GPU, or LoRA"
            )
        return v


def vllm_settings(cfg: Config) -> VLLMConfig:
    """The config's `vllm` section."""
    return cfg.section(SECTION, VLLMConfig)
