"""Frozen policies (frozen.py) and the critic (critic.py) on small stand-in modules: what a
frozen policy computes, that it leaves the policy's train/eval mode as it found it, and the
critic's start (zero head, float32 even from a bf16 policy)."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

from replayrl.learner.batching import TokenRows
from replayrl.learner.critic import ValueModel
from replayrl.learner.frozen import (
    ADAPTERS_DISABLED,
    AdaptersDisabled,
    AdapterSnapshot,
    frozen_copy,
    initial_policy,
    restore_frozen,
    snapshot,
)


class FakeLora(torch.nn.Module):
    """y = (w + on * a) * x: `w` frozen (the base), `a` trainable (the adapter); records the
    training flag each forward saw. `disable_adapter` and `peft_config` make it look LoRA."""

    peft_config: dict[str, object] = {"default": object()}

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(2.0), requires_grad=False)
        self.a = torch.nn.Parameter(torch.tensor(0.0))
        self.on = True
        self.seen_training: list[bool] = []

    @contextlib.contextmanager
    def disable_adapter(self):
        self.on = False
        try:
            yield
        finally:
            self.on = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen_training.append(self.training)
        return (self.w + (self.a if self.on else 0.0)) * x


def test_adapter_snapshot_keeps_the_adapter_weights_of_its_time() -> None:
    model = FakeLora()
    with torch.no_grad():
        model.a.fill_(1.0)
    snap = snapshot(model)
    assert isinstance(snap, AdapterSnapshot)
    assert set(snap.state_dict()) == {"a"}  # the trainable (adapter) weights only
    with torch.no_grad():
        model.a.fill_(5.0)  # the policy moves on
    x = torch.tensor(3.0)
    assert float(snap(x=x)) == 9.0  # (2 + 1) * 3: the adapter as it was
    assert float(model(x)) == 21.0  # (2 + 5) * 3
    snap.load_state_dict({"a": torch.tensor(-1.0)})
    assert float(snap(x=x)) == 3.0 and float(model.a) == 5.0  # a copy, not the policy's


def test_frozen_forwards_run_in_eval_mode_and_restore_the_mode() -> None:
    model = FakeLora()
    for frozen in (AdaptersDisabled(model), AdapterSnapshot(model)):
        for mode in (True, False):
            model.train(mode)
            model.seen_training.clear()
            frozen(x=torch.tensor(1.0))
            assert model.seen_training == [False]  # no dropout in frozen log-probs
            assert model.training is mode


def test_adapters_disabled_is_the_base_policy() -> None:
    model = FakeLora()
    with torch.no_grad():
        model.a.fill_(1.0)
    base = initial_policy(model)
    assert isinstance(base, AdaptersDisabled)
    assert float(base(x=torch.tensor(3.0))) == 6.0  # 2 * 3: adapter off
    assert model.on  # and back on afterwards
    assert base.state_dict() == ADAPTERS_DISABLED
    restored = restore_frozen(model, None, ADAPTERS_DISABLED)
    assert isinstance(restored, AdaptersDisabled) and float(restored(x=torch.tensor(1.0))) == 2.0
    # a reincarnated pi_base saved as adapter weights replaces the adapters-off one
    reborn = restore_frozen(model, base, {"a": torch.tensor(0.5)})
    assert isinstance(reborn, AdapterSnapshot) and float(reborn(x=torch.tensor(2.0))) == 5.0


def test_restore_frozen_reuses_and_loads() -> None:
    model = FakeLora()
    snap = AdapterSnapshot(model)
    again = restore_frozen(model, snap, {"a": torch.tensor(4.0)})
    assert again is snap and float(snap.tensors["a"]) == 4.0
    fresh = restore_frozen(model, None, {"a": torch.tensor(7.0)})
    assert isinstance(fresh, AdapterSnapshot) and float(fresh.tensors["a"]) == 7.0
    assert restore_frozen(model, snap, None) is None
    plain = torch.nn.Linear(2, 1)
    copy_ = frozen_copy(plain)
    assert not copy_.training and not any(p.requires_grad for p in copy_.parameters())
    assert all(p.requires_grad for p in plain.parameters())  # the policy is untouched
    loaded = restore_frozen(plain, None, {k: v * 0 for k, v in plain.state_dict().items()})
    assert loaded is not None and loaded is not plain
    assert all(float(p.abs().sum()) == 0 for p in loaded.parameters())


def test_critic_starts_at_zero_in_float32_from_a_bf16_policy(tiny_model, tmp_path: Path) -> None:
    policy = copy.deepcopy(tiny_model).to(torch.bfloat16)
    policy.save_pretrained(tmp_path)
    critic = ValueModel.from_pretrained(str(tmp_path))
    assert all(p.dtype == torch.float32 for p in critic.parameters())
    assert critic.head.in_features == tiny_model.config.hidden_size
    emb = critic.backbone.get_input_embeddings().weight
    assert torch.equal(emb, tiny_model.get_input_embeddings().weight.to(torch.bfloat16).float())
    ids = torch.tensor([[3, 4, 5, 6]])
    values = critic(TokenRows(ids, torch.ones_like(ids), torch.ones(1, 3)))
    assert values.shape == (1, 3) and torch.equal(values, torch.zeros(1, 3))
