"""Chat-template rendering, model loading options and LoRA (reference = adapters disabled)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from replayrl.config.schema import ConfigError, ModelConfig, TaskConfig, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import AdaptersDisabled, AdapterSnapshot, Learner
from replayrl.models.export import export_merged
from replayrl.models.loading import apply_lora, build_char_tokenizer, build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.rollout.prompts import render_plain, render_prompt
from replayrl.rollout.tasks import ArithmeticTask
from replayrl.run.policy import load_policy
from replayrl.run.start import resume, train
from tiny import TINY_MODEL, tiny_config

needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="peft not installed (replayrl[lora])"
)

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]


@pytest.fixture(scope="module")
def templated_tokenizer():
    tok = build_char_tokenizer(ArithmeticTask().corpus())
    tok.chat_template = TEMPLATE
    return tok


# --- chat templates -------------------------------------------------------------------------


def test_chat_template_renders_text_and_messages(templated_tokenizer) -> None:
    tok = templated_tokenizer
    assert render_prompt("2+2=", tok) == "<user>2+2=\n<assistant>"
    assert render_prompt("2+2=", tok, system_prompt="Be brief.") == (
        "<system>Be brief.\n<user>2+2=\n<assistant>"
    )
    messages = [
        {"role": "system", "content": "Own rules."},
        {"role": "user", "content": "1+1="},
    ]
    # the row's own system message wins over the configured one
    assert render_prompt(messages, tok, system_prompt="Be brief.") == (
        "<system>Own rules.\n<user>1+1=\n<assistant>"
    )
    assert messages[0]["content"] == "Own rules." and len(messages) == 2  # not modified
    # switched off: the no-template rule
    assert render_prompt("2+2=", tok, use_chat_template=False) == "2+2="
    assert render_prompt(messages, tok, use_chat_template=False) == (
        "system: Own rules.\nuser: 1+1=\nassistant:"
    )


def test_without_a_template_plain_text_passes_through(char_tokenizer) -> None:
    assert not char_tokenizer.chat_template
    assert render_prompt("37+48=", char_tokenizer) == "37+48="
    assert render_prompt([{"role": "user", "content": "37+48="}], char_tokenizer) == (
        "user: 37+48=\nassistant:"
    )
    assert render_plain("37+48=", system_prompt="Add.") == "system: Add.\nuser: 37+48=\nassistant:"


def test_run_generates_from_rendered_prompts_and_rewards_see_the_originals(
    tmp_path: Path, tiny_model, templated_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    templated_tokenizer.save_pretrained(model_dir)
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)}
        for a in range(20)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    seen = tmp_path / "seen.jsonl"
    reward_file = tmp_path / "spy.py"
    reward_file.write_text(
        "import json\n"
        "def spy(prompts, completions, answer, **kw):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write(json.dumps({'prompts': prompts, 'completions': completions}) + '\\n')\n"
        "    return [0.0 for _ in completions]\n"
    )
    sent: list[str] = []
    original = HFGenerator.generate

    def recording(self, prompts, num_samples, params):
        sent.extend(prompts)
        return original(self, prompts, num_samples, params)

    monkeypatch.setattr(HFGenerator, "generate", recording)
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "task.name=dataset",
            f"task.dataset.path={data}",
            "task.eval_size=4",
            "task.system_prompt=Add.",
            f"rewards=[{{name: '{reward_file}:spy'}}]",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.max_new_tokens=3",
            "train.steps=1",
            "logging.tensorboard=false",
            "logging.progress=false",
            f"logging.run_dir={tmp_path}",
            "logging.name=run",
        ],
    )
    train(cfg, log=lambda _: None)
    assert sent and all(p.startswith("<system>Add.\n<user>") for p in sent)
    assert all(p.endswith("<assistant>") for p in sent)
    call = json.loads(seen.read_text().splitlines()[0])
    assert call["prompts"][0][0]["role"] == "user"  # the row's messages, as they were
    assert call["completions"][0][0]["role"] == "assistant"  # TRL's conversational form


def test_demo_tokenizer_prompts_are_sent_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    original = HFGenerator.generate

    def recording(self, prompts, num_samples, params):
        sent.extend(prompts)
        return original(self, prompts, num_samples, params)

    monkeypatch.setattr(HFGenerator, "generate", recording)
    train(tiny_config(tmp_path, "train.steps=1", "eval.num_prompts=2"), log=lambda _: None)
    task = ArithmeticTask()
    assert set(sent) >= {r["prompt"] for r in task.eval_rows()[:2]}
    assert all(p.endswith("=") and "\n" not in p for p in sent)


# --- models -------------------------------------------------------------------------------


def test_model_config_has_lora_and_checkpointing_switches() -> None:
    cfg = load_config(None, ["model.lora.enabled=true", "model.gradient_checkpointing=true"])
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.task.chat_template is True and cfg.task.system_prompt is None
    with pytest.raises(ConfigError, match="model.lora.r"):
        load_config(None, ["model.lora.r=0"])
    with pytest.raises(ConfigError, match="target_modules"):
        load_config(None, ["model.lora.enabled=true", "model.lora.target_modules=[]"])


def test_hub_id_without_network_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # offline mode: fail at once instead of waiting for connection timeouts
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = ModelConfig(path="no-such-org/no-such-model")
    with pytest.raises(OSError, match="hub ids need a network"):
        load_policy(cfg, TaskConfig(), log=lambda _: None)


def test_unprepared_model_name_says_how_to_prepare() -> None:
    with pytest.raises(FileNotFoundError, match="replayrl prepare smollm2-135m"):
        load_policy(ModelConfig(path="smollm2-135m"), TaskConfig(), log=lambda _: None)


@needs_peft
def test_gradient_checkpointing_switch(tmp_path: Path, tiny_model, char_tokenizer) -> None:
    folder = tmp_path / "m"
    tiny_model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    cfg = ModelConfig.model_validate(
        {"path": str(folder), "gradient_checkpointing": True, "lora": {"enabled": True}}
    )
    model, _, _ = load_policy(cfg, TaskConfig(), log=lambda _: None)
    assert model.get_base_model().is_gradient_checkpointing
    model.train()
    ids = torch.tensor([[3, 4, 5, 6]])
    model(input_ids=ids).logits.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


# --- LoRA ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollouts(tiny_model, char_tokenizer) -> list[Rollout]:
    gen = HFGenerator(tiny_model, char_tokenizer)
    torch.manual_seed(5)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5))
    rng = np.random.default_rng(0)
    return [
        Rollout(
            prompt_ids=s.prompt_ids,
            completion_ids=s.completion_ids,
            behaviour_logprobs=s.logprobs,
            reward=1.0,
            advantage=float(rng.normal()),
            correct=True,
            group_id=s.prompt_index,
            policy_version=0,
            step=0,
        )
        for s in samples
    ]


def _lora_learner(tiny_model_config, char_tokenizer, *overrides: str):
    base = build_tiny_model(tiny_model_config, vocab_size=len(char_tokenizer), seed=0)
    plain = copy.deepcopy(base).eval()
    cfg = load_config(
        None,
        ["rollout.prompts_per_step=3", "rollout.num_generations=4", "train.lr=5e-2", *overrides],
    )
    policy = apply_lora(base, cfg.model)
    return Learner(policy, char_tokenizer.pad_token_id, cfg), plain


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


@needs_peft
def test_lora_reference_is_the_base_with_adapters_disabled(
    rollouts, tiny_model_config, char_tokenizer
) -> None:
    learner, plain = _lora_learner(tiny_model_config, char_tokenizer, *LORA, "kl.beta=0.1")
    policy = learner.model
    assert isinstance(learner.base_model, AdaptersDisabled)
    assert learner.base_model.model is policy  # no second copy of the model
    adapters = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    assert sum(len(g["params"]) for g in learner.optimizer.param_groups) == len(adapters)

    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if n not in adapters}
    ref0 = _flat(learner.assembly.per_rollout(learner.base_model, rollouts))
    plain_lp = _flat(learner.assembly.per_rollout(plain, rollouts))
    assert torch.allclose(ref0, plain_lp, atol=1e-6)  # reference = the base model
    assert torch.allclose(
        _flat(learner.assembly.per_rollout(policy, rollouts)), plain_lp, atol=1e-6
    )

    metrics = learner.train_step(rollouts, np.random.default_rng(0), step=1)
    assert metrics["kl_coef_base"] == pytest.approx(0.1)
    policy_lp = _flat(learner.assembly.per_rollout(policy, rollouts))
    ref1 = _flat(learner.assembly.per_rollout(learner.base_model, rollouts))
    assert torch.allclose(ref1, plain_lp, atol=1e-6)  # still the base after the update
    assert (policy_lp - plain_lp).abs().max() > 1e-3  # the adapted policy moved away
    for n, p in policy.named_parameters():  # only the adapters changed
        if n in adapters:
            continue
        assert torch.equal(p, base_before[n]), n
    assert any(p.abs().max() > 0 for n, p in policy.named_parameters() if "lora_B" in n)


@needs_peft
def test_lora_frozen_policies_are_adapter_snapshots(
    rollouts, tiny_model_config, char_tokenizer
) -> None:
    convex = ("kl.beta=0.1", "kl.target=convex", "kl.schedule.start=0", "kl.schedule.every=1")
    learner, _ = _lora_learner(tiny_model_config, char_tokenizer, *LORA, *convex)
    before = _flat(learner.assembly.per_rollout(learner.model, rollouts))
    learner.train_step(rollouts, np.random.default_rng(0), step=1)
    # pi_{k-1} for the next step: the policy this step started from, adapters copied
    assert isinstance(learner.prev_model, AdapterSnapshot)
    assert torch.allclose(_flat(learner.assembly.per_rollout(learner.prev_model, rollouts)), before)
    now = _flat(learner.assembly.per_rollout(learner.model, rollouts))
    assert (now - before).abs().max() > 1e-4
    learner.reincarnate()
    assert isinstance(learner.base_model, AdapterSnapshot)
    assert torch.allclose(_flat(learner.assembly.per_rollout(learner.base_model, rollouts)), now)
    learner.train_step(rollouts, np.random.default_rng(1), step=2)
    moved = _flat(learner.assembly.per_rollout(learner.model, rollouts))
    assert (moved - now).abs().max() > 1e-4
    assert torch.allclose(_flat(learner.assembly.per_rollout(learner.base_model, rollouts)), now)
    state = learner.state_dict()  # round trip of the snapshots (resume)
    other, _ = _lora_learner(tiny_model_config, char_tokenizer, *LORA, *convex)
    other.model.load_state_dict(learner.model.state_dict())
    other.load_state_dict(state)
    assert isinstance(other.base_model, AdapterSnapshot)
    assert torch.allclose(_flat(other.assembly.per_rollout(other.base_model, rollouts)), now)


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory: pytest.TempPathFactory):
    """The same LoRA run straight to 3 steps, and to 2 steps then resumed to 3."""
    root = tmp_path_factory.mktemp("lora_runs")
    reward = root / "length.py"  # varies within a group, so advantages are not all zero
    reward.write_text(
        "def length(prompts, completions, **kw):\n    return [len(c) for c in completions]\n"
    )
    common = (
        *LORA,
        f"rewards=[{{name: '{reward}:length'}}]",
        "kl.beta=0.05",
        "train.lr=2e-2",
        "checkpoint.every=1",
    )
    quiet = lambda _: None  # noqa: E731
    straight = train(tiny_config(root, *common, "train.steps=3", "logging.name=a"), log=quiet)
    train(tiny_config(root, *common, "train.steps=2", "logging.name=b"), log=quiet)
    resumed = resume(root / "b", ["train.steps=3"], log=quiet)
    return root, straight, resumed


@needs_peft
def test_lora_checkpoint_holds_the_adapter_and_resume_matches(lora_runs) -> None:
    from safetensors.torch import load_file

    root, straight, resumed = lora_runs
    assert straight["steps"] == resumed["steps"] == 3
    policy = root / "a" / "checkpoints" / "step_000003" / "policy"
    assert (policy / "adapter_config.json").is_file()
    assert (policy / "adapter_model.safetensors").is_file()
    assert not (policy / "model.safetensors").exists()  # the adapter only
    a = load_file(policy / "adapter_model.safetensors")
    b = load_file(
        root / "b" / "checkpoints" / "step_000003" / "policy" / "adapter_model.safetensors"
    )
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(t.abs().max() > 0 for k, t in a.items() if "lora_B" in k)  # it trained


@needs_peft
def test_export_merged_loads_with_from_pretrained(lora_runs, tmp_path: Path) -> None:
    from replayrl.cli.main import main

    root, _, _ = lora_runs
    out = tmp_path / "merged"
    assert main(["export-merged", str(root / "a"), str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    # the same function as the base + adapter (an adapter folder loads with its base)
    cfg = ModelConfig(path=str(root / "a" / "checkpoints" / "step_000003" / "policy"))
    adapted, tok, _ = load_policy(cfg, TaskConfig(), log=lambda _: None)
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(
            merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5
        )
    # the base alone differs: the merge did carry the adapter
    base_cfg = load_config(None, TINY_MODEL).model
    base, _, _ = load_policy(base_cfg, TaskConfig(), log=lambda _: None)
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, merged(input_ids=ids).logits)
    again = export_merged(out, tmp_path / "copy")  # a plain folder is copied as it is
    assert (again / "config.json").is_file()


@needs_peft
def test_a_lora_run_ends_with_the_merged_model_in_final(lora_runs) -> None:
    root, _, _ = lora_runs
    final = root / "a" / "final"
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    _same_as_the_adapter(final, root / "a" / "checkpoints" / "step_000003" / "policy")


def _same_as_the_adapter(folder: Path, adapter: Path) -> None:
    """`folder` is a plain model (no LoRA layers) computing what base + `adapter` computes."""
    merged = AutoModelForCausalLM.from_pretrained(folder)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    adapted, tok, _ = load_policy(ModelConfig(path=str(adapter)), TaskConfig(), log=lambda _: None)
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(
            merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5
        )
