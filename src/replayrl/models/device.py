"""Where a run's tensors live: `train.device` resolved, models placed, CUDA memory errors
turned into a message that says what to lower.

Every tensor that enters the policy, the frozen KL policies or the critic is moved to the
device of that model's parameters (`model_device`), so a model the Python API hands over on
a GPU trains there, and the CLI trains where `train.device` says.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

# auto, cpu, cuda or cuda:N (the values `train.device` accepts)
DEVICE_PATTERN = r"^(auto|cpu|cuda|cuda:\d+)$"


class DeviceUnavailable(ValueError):
    """`train.device` names a device this machine does not have (the CLI prints one line)."""


def resolve_device(
    spec: str,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
    cuda_count: Callable[[], int] = torch.cuda.device_count,
) -> torch.device:
    """`train.device` as a torch.device: auto = cuda when this machine has CUDA, else cpu.

    cuda / cuda:N on a machine without CUDA (or without GPU N) raise DeviceUnavailable with
    a one-line message instead of a failure deep in torch at the first tensor moved.
    """
    if not re.match(DEVICE_PATTERN, spec):
        raise DeviceUnavailable(f"train.device={spec!r}: use auto, cpu, cuda or cuda:N")
    if spec == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        raise DeviceUnavailable(
            f"train.device={spec} but this machine has no CUDA GPU (or torch was built without "
            "CUDA): use train.device=cpu or auto"
        )
    device = torch.device(spec)
    if device.index is not None and device.index >= cuda_count():
        raise DeviceUnavailable(
            f"train.device={spec} but this process sees {cuda_count()} CUDA GPU(s) "
            "(CUDA_VISIBLE_DEVICES renumbers them from 0)"
        )
    return device


def model_device(model: object) -> torch.device:
    """The device of a model's first parameter (cpu for a model without parameters)."""
    params = getattr(model, "parameters", None)
    if params is None:
        return torch.device("cpu")
    first = next(iter(params()), None)
    return torch.device("cpu") if first is None else first.device


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or other accelerator) out-of-memory error, by type or torch's message."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None
    )
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def oom_phase(exc: BaseException, frames: tuple[str, ...] = ("/rollout/generation/",)) -> str:
    """'generation' when the error was raised inside a rollout backend (a file whose path
    holds one of its `frames`: `BackendSpec.frames`), else 'training'."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if any(frame in name for frame in frames):
            return "generation"
        tb = tb.tb_next
    return "training"


def out_of_memory_message(
    where: str,
    last_checkpoint: str | None,
    generation_knobs: str = "rollout.decode_batch_size (generation)",
) -> str:
    """One line: what ran out of memory, the knobs that lower memory (the generation
    backend's: `BackendSpec.memory_knobs`), the checkpoint to resume from."""
    resume = (
        f"last good checkpoint: {last_checkpoint} (resume with --resume)"
        if last_checkpoint
        else "no checkpoint written yet"
    )
    return (
        f"out of GPU memory during {where}: lower train.micro_batch_size (learner), "
        f"{generation_knobs}, or train with model.lora.enabled=true; {resume}"
    )
