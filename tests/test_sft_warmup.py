"""model.sft: a pretrained model's supervised warm-up on the task's answers, cached."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.models.loading import atomic_save_pretrained, build_char_tokenizer, build_tiny_model
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.tasks import task_from_config
from replayrl.run import warmstart
from replayrl.run.policy import load_policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="reasoning-gym not installed"
)

RG = [
    "task.name=reasoning_gym",
    "task.reasoning_gym.datasets=[chain_sum]",
    "task.reasoning_gym.size=300",
    "task.eval_size=16",
    "task.reasoning_gym.config={chain_sum: {min_terms: 2, max_terms: 2, max_digits: 1}}",
]
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _cfg(model_path: Path | str, *extra: str):
    return load_config(None, [*RG, f"model.path={model_path}", *extra])


@pytest.fixture(scope="module")
def rg_task():
    return task_from_config(load_config(None, RG).task)


@pytest.fixture(scope="module")
def tiny_pretrained(tmp_path_factory: pytest.TempPathFactory, rg_task) -> Path:
    """A tiny random Llama saved as a pretrained folder, with a char tokenizer covering the
    task's text and a chat template (stands in for an instruct model)."""
    rows = rg_task.sample_train(50, np.random.default_rng(0))
    corpus = [r["prompt"][0]["content"] + r["prompt"][1]["content"] for r in rows]
    tok = build_char_tokenizer([*corpus, "<answer></answer>-0123456789<>\n"])
    tok.chat_template = TEMPLATE
    cfg = load_config(None, ["model.tiny.num_layers=1", "model.tiny.hidden_size=32"]).model
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=0)
    dest = tmp_path_factory.mktemp("pretrained") / "tiny-llama"
    atomic_save_pretrained(model, tok, dest)
    return dest


def test_teacher_replies_are_tagged_answers_or_near_misses(rg_task) -> None:
    rows = rg_task.sample_train(40, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    assert [rg_task.sft_completion(r, rng, 0.0) for r in rows] == [
        f"<answer>{r['answer']}</answer>" for r in rows
    ]
    wrong = [rg_task.sft_completion(r, rng, 1.0) for r in rows]
    for row, reply in zip(rows, wrong, strict=True):
        assert reply.startswith("<answer>") and reply.endswith("</answer>")
        delta = int(reply[len("<answer>") : -len("</answer>")]) - int(row["answer"])
        assert delta in {-10, -1, 1, 10}
    # seeded: the same draws give the same replies
    again = np.random.default_rng(2)
    [rg_task.sft_completion(r, again, 0.0) for r in rows]
    assert [rg_task.sft_completion(r, again, 1.0) for r in rows] == wrong
    # about half wrong at error rate 0.5
    half = [rg_task.sft_completion(r, rng, 0.5) for r in rows * 5]
    n_wrong = sum(
        h != f"<answer>{r['answer']}</answer>" for h, r in zip(half, rows * 5, strict=True)
    )
    assert 60 <= n_wrong <= 140


def test_pairs_render_prompts_as_the_run_does(rg_task, tiny_pretrained) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_pretrained)
    render = PromptRenderer(tok, True, None)
    pairs = warmstart.RenderedPairs(rg_task, render).sft_pairs(6, np.random.default_rng(3), 0.0)
    rows = rg_task.sample_train(6, np.random.default_rng(3))
    assert [p for p, _ in pairs] == [render(r["prompt"]) for r in rows]
    assert pairs[0][0].startswith("<system>") and pairs[0][0].endswith("<assistant>")
    assert [c for _, c in pairs] == [f"<answer>{r['answer']}</answer>" for r in rows]


def _teacher_nll(folder: Path, rg_task) -> float:
    """Mean NLL of the right tagged answers on held-out rows under the model in `folder`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    render = PromptRenderer(tok, True, None)
    total, count = 0.0, 0
    for row in rg_task.eval_rows():
        p = tok(render(row["prompt"]), add_special_tokens=False)["input_ids"]
        c = tok(f"<answer>{row['answer']}</answer>", add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        targets = ids[0, 1:]
        nll = -logp.gather(-1, targets[:, None])[:, 0][len(p) - 1 :]
        total, count = total + float(nll.sum()), count + len(c)
    return total / count


@pytest.mark.parametrize(
    ("how", "nll_ratio"),
    [
        (["model.sft.lora_r=0", "model.sft.lr=1e-2"], 0.8),
        # LoRA on a random 32-wide model (frozen random embeddings) learns less in 30 steps
        (["model.sft.lora_r=8", "model.sft.lr=3e-2"], 0.95),
    ],
)
def test_warmup_is_built_once_learns_the_replies_and_is_what_runs_load(
    how: list[str], nll_ratio: float, tiny_pretrained, rg_task, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tiny_pretrained, "model.sft.steps=30", "model.sft.batch_size=4", *how)
    logs: list[str] = []
    model, tok, path = load_policy(cfg.model, cfg.task, log=logs.append)
    assert Path(path).parent.name == "sft" and Path(path) != tiny_pretrained
    assert any("supervised warm-up done" in m for m in logs)
    # it learned the teacher's replies: lower NLL of the tagged right answers than before
    before = _teacher_nll(tiny_pretrained, rg_task)
    assert _teacher_nll(Path(path), rg_task) < nll_ratio * before
    assert not (Path(path) / "adapter_config.json").exists()  # LoRA merged: a plain folder
    assert any(Path(path).glob("*.safetensors"))  # saved as safetensors, no pickles
    # cached: a second load does not train again
    monkeypatch.setattr(warmstart, "_sft_phase", lambda *a, **k: pytest.fail("rebuilt"))
    _, _, again = load_policy(cfg.model, cfg.task, log=logs.append)
    assert again == path
    # another warm-up config or task is another folder
    other = _cfg(tiny_pretrained, "model.sft.steps=31", *how)
    assert (
        warmstart.sft_warmup_key(str(tiny_pretrained), other.model, other.task) != Path(path).name
    )
    moved = _cfg(
        tiny_pretrained, "model.sft.steps=30", "model.sft.batch_size=4", "task.seed=3", *how
    )
    assert (
        warmstart.sft_warmup_key(str(tiny_pretrained), moved.model, moved.task) != Path(path).name
    )
    # steps=0 (the default): the pretrained folder itself
    plain = _cfg(tiny_pretrained)
    assert load_policy(plain.model, plain.task, log=logs.append)[2] == str(tiny_pretrained)


def test_warmup_errors_are_clear(tiny_pretrained, tmp_path: Path) -> None:
    cfg = load_config(None, [f"model.path={tiny_pretrained}", "model.sft.steps=3"])
    with pytest.raises(ValueError, match="no teacher replies"):  # arithmetic: no sft_completion
        load_policy(cfg.model, cfg.task, log=lambda _: None)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="adapter folder"):
        warmstart.ensure_sft_warmup(str(adapter), cfg.model, cfg.task, log=lambda _: None)


def test_parallel_first_runs_build_once_under_a_lock(
    tiny_pretrained, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processes starting together (a suite's parallel runs) must not build the same warm-up
    twice: the builder holds the lock, a latecomer finds the folder built."""
    import fcntl

    cfg = _cfg(tiny_pretrained, "model.sft.steps=7")
    built: list[Path] = []

    def fake_build(path, model_cfg, task_cfg, dest: Path, log, device=None) -> None:
        lock = dest.parent / f".{dest.name}.lock"
        with open(lock, "w") as other:  # another process's attempt: must find it held
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("{}")
        built.append(dest)

    monkeypatch.setattr(warmstart, "_build_sft_warmup", fake_build)
    first = warmstart.ensure_sft_warmup(str(tiny_pretrained), cfg.model, cfg.task, log=print)
    second = warmstart.ensure_sft_warmup(str(tiny_pretrained), cfg.model, cfg.task, log=print)
    assert first == second == built[0] and len(built) == 1
