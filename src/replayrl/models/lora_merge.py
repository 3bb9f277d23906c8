"""LoRA adapters merged into the weights an inference engine receives (TRL pushes merged
weights to vLLM the same way: merge, push, unmerge; here the merged tensors are new ones and
the trained model is never touched)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

# peft's names inside the wrapped model: <module>.base_layer.<param>,
# <module>.lora_A.<adapter>.weight, <module>.lora_B.<adapter>.weight
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.[^.]+\.weight$")
_BASE = re.compile(r"^(?P<module>.+)\.base_layer\.(?P<param>[^.]+)$")


def merged_weight(
    base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """W' = W + s B A (LoRA, arXiv 2106.09685 eq. 3; s = alpha / r), in W's dtype; a
    transposed (fan-in-fan-out, GPT-2's Conv1D) W gets (B A)^T."""
    delta = (b.float() @ a.float()) * scaling
    if delta.shape != base.shape:
        delta = delta.T
    if delta.shape != base.shape:
        raise ValueError(
            f"LoRA update of shape {tuple(delta.shape)} for a weight {tuple(base.shape)}"
        )
    return (base.float() + delta).to(base.dtype)


def merged_lora_tensors(
    named: Iterable[tuple[str, torch.Tensor]], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of a model with peft LoRA layers, as the plain model's: each
    wrapped linear's weight merged (base + s B A) under its original name, its other
    parameters renamed, the adapters themselves left out. Other tensors pass unchanged."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        lora, base = _LORA.match(name), _BASE.match(name)
        if lora is None and base is None:
            yield name, tensor
            continue
        if base is not None and base["param"] != "weight":
            yield f"{base['module']}.{base['param']}", tensor  # the wrapped linear's bias
            continue
        module = (lora or base)["module"]  # type: ignore[index]
        parts = pending.setdefault(module, {})
        parts[lora["which"] if lora is not None else "W"] = tensor
        if len(parts) == 3:
            del pending[module]
            yield f"{module}.weight", merged_weight(parts["W"], parts["A"], parts["B"], scaling)
    if pending:
        raise ValueError(f"LoRA layers without their base weight or adapters: {sorted(pending)}")
