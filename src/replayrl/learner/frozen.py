"""Frozen policies for the KL terms (pi_base, pi_{k-1}).

Full fine-tuning keeps frozen deep copies. With LoRA the initial policy is the base model
with the adapters disabled (no copy at all), and any later frozen policy (pi_{k-1}, a
reincarnated pi_base) is a copy of the adapter weights only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch

ADAPTERS_DISABLED = "adapters_disabled"  # checkpoint marker for the LoRA reference
_T = TypeVar("_T")


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class _EvalForward:
    """Runs the shared policy module in eval mode (no dropout) and restores its mode."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, **kwargs: Any) -> Any:
        return self.run_with(lambda m: m(**kwargs))

    def run_with(self, fn: Callable[[torch.nn.Module], _T]) -> _T:
        """fn(the policy module acting as this frozen policy): lets the learner's chunked
        log-prob path run on it instead of a full-logits forward."""
        was_training = self.model.training
        self.model.eval()
        try:
            return self._run(fn)
        finally:
            self.model.train(was_training)

    def _run(self, fn: Callable[[torch.nn.Module], _T]) -> _T:
        raise NotImplementedError


class _Call(torch.nn.Module):
    """Holds the policy so that `functional_call` can swap its adapter tensors around `fn`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[torch.nn.Module], Any]) -> Any:
        return fn(self.model)


class AdaptersDisabled(_EvalForward):
    """pi_base of a LoRA policy: the policy module itself with its adapters switched off.

    LoRA starts with B = 0, so this is the initial policy, exactly, with no second copy of
    the model; the base weights never train, so it stays that.
    """

    def _run(self, fn: Callable[[torch.nn.Module], _T]) -> _T:
        with self.model.disable_adapter():  # type: ignore[operator]
            return fn(self.model)

    def state_dict(self) -> str:
        return ADAPTERS_DISABLED

    def load_state_dict(self, state: object) -> None:
        pass


class AdapterSnapshot(_EvalForward):
    """A frozen LoRA policy: a copy of the adapter weights only (pi_{k-1} for KL-Convex, a
    reincarnated pi_base), evaluated through the policy module with `functional_call`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.tensors = {
            n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
        }

    def _run(self, fn: Callable[[torch.nn.Module], _T]) -> _T:
        tensors = {f"model.{n}": t for n, t in self.tensors.items()}
        return torch.func.functional_call(_Call(self.model), tensors, args=(fn,))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy the adapter weights from `state` (an adapter snapshot or the policy's own)."""
        with torch.no_grad():
            for name, t in self.tensors.items():
                t.copy_(state[name])


FrozenPolicy = torch.nn.Module | AdaptersDisabled | AdapterSnapshot


def initial_policy(model: torch.nn.Module) -> FrozenPolicy:
    """pi_base at the start: the adapters switched off (LoRA) or a frozen copy."""
    return AdaptersDisabled(model) if is_lora(model) else frozen_copy(model)


def snapshot(model: torch.nn.Module) -> FrozenPolicy:
    """The current policy, frozen (adapter weights only with LoRA)."""
    return AdapterSnapshot(model) if is_lora(model) else frozen_copy(model)


def restore_frozen(
    model: torch.nn.Module, current: FrozenPolicy | None, weights: object
) -> FrozenPolicy | None:
    """A frozen policy from its checkpoint state (reusing `current`'s memory when possible)."""
    if weights is None:
        return None
    if weights == ADAPTERS_DISABLED:
        return AdaptersDisabled(model)
    frozen: Any
    if is_lora(model):
        frozen = current if isinstance(current, AdapterSnapshot) else None
        frozen = frozen or AdapterSnapshot(model)
    else:
        frozen = current or frozen_copy(model)
    frozen.load_state_dict(weights)
    return frozen
