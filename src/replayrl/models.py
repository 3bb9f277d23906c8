"""Load HF causal LMs; build the tiny demo model (local char tokenizer + few-layer Llama)
and its cached, deterministic SFT warm start."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from replayrl.config import ModelConfig, TaskConfig

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Where warm starts are cached: $REPLAYRL_CACHE or ~/.cache/replayrl."""
    root = os.environ.get("REPLAYRL_CACHE") or Path.home() / ".cache" / "replayrl"
    return Path(root)


def build_char_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """Train a character-level tokenizer on the task's text with `tokenizers`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    specials = ["<pad>", "</s>", "<s>", "<unk>"]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **SPECIAL_TOKENS)
    fast.padding_side = "left"
    return fast


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> LlamaForCausalLM:
    t = cfg.tiny
    if t.hidden_size % t.num_heads:
        raise ValueError(
            f"model.tiny.hidden_size={t.hidden_size} must be divisible by "
            f"model.tiny.num_heads={t.num_heads}"
        )
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _sft_phase(
    model: LlamaForCausalLM,
    tok: PreTrainedTokenizerBase,
    task,
    rng: np.random.Generator,
    steps: int,
    batch_size: int,
    lr: float,
    carry_error: float,
) -> float:
    """Teacher-forced SFT on (prompt, completion+EOS) pairs; loss on completion tokens only."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1 - s / max(steps, 1))
    )
    model.train()
    loss_val = float("nan")
    for _ in range(steps):
        pairs = task.sft_pairs(batch_size, rng, carry_error)
        seqs, masks = [], []
        for prompt, completion in pairs:
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append(p + c)
            masks.append([0] * len(p) + [1] * len(c))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        lmask = torch.zeros_like(ids, dtype=torch.float32)
        for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            lmask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        targets, tmask = ids[:, 1:], lmask[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        ).view_as(targets)
        loss = (nll * tmask).sum() / tmask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
    model.eval()
    return loss_val


def _sft(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, task_cfg: TaskConfig, cfg: ModelConfig
) -> dict[str, float]:
    """Phase 1 on correct answers, then phase 2 on the task's mistaken teacher
    (`task.sft_pairs(n, rng, error_rate)` at `teacher_carry_error`)."""
    from replayrl.tasks import task_from_config

    ws = cfg.warmstart
    task = task_from_config(task_cfg)
    rng = np.random.default_rng(ws.seed)
    torch.manual_seed(ws.seed)
    out = {"sft_loss": _sft_phase(model, tok, task, rng, ws.steps, ws.batch_size, ws.lr, 0.0)}
    if ws.mistake_steps:
        out["sft_mistake_loss"] = _sft_phase(
            model,
            tok,
            task,
            rng,
            ws.mistake_steps,
            ws.batch_size,
            ws.mistake_lr,
            ws.teacher_carry_error,
        )
    return out


# the TaskConfig fields each built-in task's warm start depends on (arithmetic's set is the
# original one: existing configs keep their cached warm starts)
_WARMSTART_TASK_FIELDS = {
    "arithmetic": {"name", "digits", "eval_size", "seed"},
    "reasoning": {"name", "op", "digits", "min_digits", "terms", "eval_size", "seed"},
}
# arithmetic digits the built-in warm start gives a usable start policy for (measured: 3
# digits start at 0.0 eval accuracy with the default warm start, and nothing learns)
TINY_ARITHMETIC_DIGITS = (1, 2)


def _warmstart_task_fields(task_cfg: TaskConfig) -> set[str]:
    return _WARMSTART_TASK_FIELDS.get(task_cfg.name, set(TaskConfig.model_fields))


def check_tiny_task(task_cfg: TaskConfig) -> None:
    """Refuse tasks the built-in tiny model's warm start cannot start usefully (clear error)."""
    if task_cfg.name == "arithmetic" and task_cfg.digits not in TINY_ARITHMETIC_DIGITS:
        raise ValueError(
            f"task.digits={task_cfg.digits}: the built-in tiny model's warm start gives a usable "
            f"start policy for arithmetic with task.digits in {list(TINY_ARITHMETIC_DIGITS)} only "
            f"(at 3 digits it starts at 0.0 accuracy and no reward ever varies). For longer "
            f"sums use the written-out task (task.name=reasoning task.op=add "
            f"task.digits={task_cfg.digits}; see configs/reasoning-add.yaml), or set model.path "
            f"to a causal LM folder"
        )


def warmstart_key(cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    payload = json.dumps(
        {
            "tiny": cfg.tiny.model_dump(),
            "warmstart": cfg.warmstart.model_dump(),
            # only what the task's warm start depends on: stable as TaskConfig grows
            "task": task_cfg.model_dump(include=_warmstart_task_fields(task_cfg)),
            "format": 2,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def atomic_save_pretrained(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, dest: Path
) -> None:
    """save_pretrained into a temp folder beside `dest`, then rename it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_warmstart(cfg: ModelConfig, task_cfg: TaskConfig, log=print) -> Path:
    """Path of the tiny model's SFT warm start for this config, building it once if missing."""
    check_tiny_task(task_cfg)
    dest = cache_dir() / "warmstart" / warmstart_key(cfg, task_cfg)
    if (dest / "config.json").is_file():
        return dest
    from replayrl.tasks import task_from_config

    task = task_from_config(task_cfg)
    # any task with a tokenizer corpus and an SFT teacher (arithmetic, reasoning) has one
    if not (callable(getattr(task, "corpus", None)) and callable(getattr(task, "sft_pairs", None))):
        raise ValueError(
            f"the built-in tiny model's warm start needs a task with corpus() and "
            f"sft_pairs(n, rng, error_rate) (task.name=arithmetic or reasoning), not "
            f"{task_cfg.name!r}: set model.path to a causal LM folder"
        )
    tok = build_char_tokenizer(task.corpus())
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=cfg.warmstart.seed)
    if cfg.warmstart.enabled and cfg.warmstart.steps:
        ws = cfg.warmstart
        log(f"building the tiny model's SFT warm start ({ws.steps}+{ws.mistake_steps} steps)")
        stats = _sft(model, tok, task_cfg, cfg)
        log(f"warm start done ({', '.join(f'{k} {v:.3f}' for k, v in stats.items())}) -> {dest}")
    atomic_save_pretrained(model, tok, dest)
    return dest


PREPARED_MODELS = ("smollm2-135m",)  # names `replayrl prepare` knows


def prepared_model_dir(name: str) -> Path:
    """Where `replayrl prepare NAME` writes its model folder."""
    return cache_dir() / "models" / name


def resolve_model_path(path: str) -> str:
    """A local folder as it is (`~` expanded); a prepared model's name -> its cache folder;
    anything else is returned unchanged (a hub id)."""
    local = Path(path).expanduser()
    if local.exists():
        if (
            local.is_dir()
            and not (local / "config.json").is_file()
            and not is_adapter_folder(local)
        ):
            raise FileNotFoundError(f"not a model folder: {local} has no config.json")
        if not local.is_dir():
            raise FileNotFoundError(f"not a model folder: {local} is a file")
        return str(local)
    if path in PREPARED_MODELS:
        prepared = prepared_model_dir(path)
        if (prepared / "config.json").is_file():
            return str(prepared)
        raise FileNotFoundError(
            f"model.path={path!r}: not prepared yet (no {prepared}); run "
            f"`replayrl prepare {path}` first"
        )
    if local.is_absolute() or path.startswith((".", "~")) or path.count("/") > 1:
        raise FileNotFoundError(f"model.path={path!r}: no such folder")
    return path


def is_adapter_folder(path: str | Path) -> bool:
    """A LoRA adapter saved by peft (adapter_config.json, no full model weights)."""
    p = Path(path)
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (its LoRA layers stay active)."""
    return model.get_base_model() if is_peft_model(model) else model


def _import_peft():
    try:
        import peft
    except ImportError as exc:
        raise ImportError(
            "model.lora.enabled (and LoRA adapter folders) need peft: pip install 'peft>=0.13' "
            "(or replayrl[lora])"
        ) from exc
    return peft


def _from_pretrained(path: str, dtype: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    hub_id = not Path(path).exists()
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    except Exception as exc:
        if hub_id:
            raise OSError(
                f"model.path={path!r} is not a local folder, and loading it as a Hugging Face "
                f"hub id failed: hub ids need a network (this machine may have none). Download "
                f"the model where there is one and set model.path to its folder (for "
                f"SmolLM2-135M-Instruct offline: `replayrl prepare smollm2-135m`, then "
                f"model.path=smollm2-135m). Cause: {type(exc).__name__}: {exc}"
            ) from exc
        raise OSError(
            f"model.path={path!r} could not be loaded as a causal LM folder "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return model, tok


def apply_lora(model: PreTrainedModel, cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """Wrap the policy with fresh LoRA adapters (base weights frozen; A drawn from `seed`,
    B = 0, so the wrapped policy starts equal to the base)."""
    peft = _import_peft()
    lc = cfg.lora
    config = peft.LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return peft.get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n})
        raise ValueError(
            f"model.lora.target_modules={lc.target_modules}: {exc} (module names in this "
            f"model include: {', '.join(names[:30])})"
        ) from exc


def _attach_adapter(model: PreTrainedModel, adapter: Path, trainable: bool) -> torch.nn.Module:
    peft = _import_peft()
    return peft.PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)


def _adapter_base(adapter: Path) -> str:
    data = json.loads((adapter / "adapter_config.json").read_text())
    base = data.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}/adapter_config.json does not name its base model")
    return str(base)


def load_policy(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    log=print,
    adapter: str | Path | None = None,
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The policy to train and its tokenizer: `model.path` if set, else the tiny warm start.

    With `model.lora.enabled` the model comes back wrapped in fresh LoRA adapters (drawn
    from `seed`), or in the saved ones of `adapter` (resume). A `model.path` that is itself
    an adapter folder loads its base model (named in adapter_config.json) with the adapter
    on top. `model.gradient_checkpointing` switches it on for the policy.
    """
    path = resolve_model_path(cfg.path) if cfg.path else str(ensure_warmstart(cfg, task_cfg, log))
    if adapter is None and is_adapter_folder(path):
        adapter, path = Path(path), resolve_model_path(_adapter_base(Path(path)))
    model, tok = _from_pretrained(path, cfg.dtype)
    model, tok = prepare_policy(model, tok, cfg, adapter=adapter, seed=seed)
    return model, tok, path


def prepare_policy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    cfg: ModelConfig,
    adapter: str | Path | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Make a loaded causal LM and its tokenizer ready to train (what `load_policy` does after
    loading; also for model objects handed to the Python API): a pad token, left padding,
    `model.gradient_checkpointing`, and LoRA adapters (fresh from `seed`, or `adapter`'s)."""
    if not isinstance(tok, PreTrainedTokenizerBase):
        raise TypeError(
            f"the tokenizer must be a transformers tokenizer (got {type(tok).__name__})"
        )
    if tok.pad_token_id is None:
        if tok.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # no KV cache in training forwards (generate keeps it: HFGenerator's GenerationConfig)
        model.config.use_cache = False
    if adapter is not None:
        model = _attach_adapter(model, Path(adapter), trainable=cfg.lora.enabled)
    elif cfg.lora.enabled and not is_peft_model(model):
        model = apply_lora(model, cfg, seed=seed)
    return model, tok


def _resolve_checkpoint(src: Path) -> Path:
    """A run folder (its latest checkpoint), a checkpoint folder, or a policy folder."""
    from replayrl.checkpoint import latest_checkpoint

    if (src / "checkpoints").is_dir():
        ckpt = latest_checkpoint(src)
        if ckpt is None:
            raise FileNotFoundError(f"{src}: no complete checkpoint under checkpoints/")
        src = ckpt
    if (src / "policy").is_dir():
        src = src / "policy"
    return src


def export_merged(src: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write a plain model folder (LoRA merged into the weights) loadable with from_pretrained.

    `src`: a run folder, a checkpoint folder or a policy folder (a LoRA adapter or a full
    model, which is copied as it is).
    """
    policy = _resolve_checkpoint(Path(src).expanduser())
    dest = Path(out).expanduser()
    if is_adapter_folder(policy):
        base = resolve_model_path(_adapter_base(policy))
        model, tok = _from_pretrained(base, dtype)
        model = _attach_adapter(model, policy, trainable=False).merge_and_unload()
        if (policy / "tokenizer_config.json").is_file():  # the run's tokenizer (pad, side)
            tok = AutoTokenizer.from_pretrained(policy)
    elif (policy / "config.json").is_file():
        model, tok = _from_pretrained(str(policy), dtype)
    else:
        raise FileNotFoundError(f"{policy}: neither a LoRA adapter nor a model folder")
    atomic_save_pretrained(model, tok, dest)
    return dest
