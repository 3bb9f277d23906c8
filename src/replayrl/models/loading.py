"""Load HF causal LMs (local folders, prepared models, LoRA adapters) and build the tiny demo
model (local char tokenizer + few-layer Llama). Its SFT warm start is warmstart.py's; the
merged export is export.py's: this module imports nothing above it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

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

from replayrl.config.schema import ModelConfig

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# a causal LM with this attribute False stays off the learner's lean forward
LEAN_ATTR = "replayrl_lean_forward"


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


def atomic_folder(dest: str | Path, fill: Callable[[Path], object]) -> Path:
    """`fill(tmp)` writes a temporary folder beside `dest`, which then replaces `dest` by a
    rename: a reader sees the old folder or the new one, never half of one; on any error the
    temporary folder is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        fill(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def atomic_save_pretrained(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, dest: Path
) -> None:
    """save_pretrained into a temp folder beside `dest`, then rename it into place."""

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    atomic_folder(dest, fill)


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


def load_pretrained(path: str, dtype: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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
        # ["all-linear"]: peft's own shorthand for every linear layer but the output head
        target_modules="all-linear"
        if lc.target_modules == ["all-linear"]
        else list(lc.target_modules),
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


def attach_adapter(model: PreTrainedModel, adapter: Path, trainable: bool) -> torch.nn.Module:
    peft = _import_peft()
    return peft.PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)


def adapter_base(adapter: Path) -> str:
    data = json.loads((adapter / "adapter_config.json").read_text())
    base = data.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}/adapter_config.json does not name its base model")
    return str(base)


def load_pretrained_policy(
    path: str,
    cfg: ModelConfig,
    adapter: str | Path | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, str]:
    """Load the causal LM folder (or hub id) `path` and make it ready to train (prepare_policy).

    An adapter folder loads its base model (named in adapter_config.json) with the adapter on
    top; the returned path is the base model's then.
    """
    if adapter is None and is_adapter_folder(path):
        adapter, path = Path(path), resolve_model_path(adapter_base(Path(path)))
    model, tok = load_pretrained(path, cfg.dtype)
    policy, tok = prepare_policy(model, tok, cfg, adapter=adapter, seed=seed)
    return policy, tok, path


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
    # read by learner/lean_forward.py (set before any LoRA wrapping, on the causal LM itself)
    setattr(model, LEAN_ATTR, cfg.lean_forward)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # no KV cache in training forwards (generate keeps it: HFGenerator's GenerationConfig)
        model.config.use_cache = False
    if adapter is not None:
        model = attach_adapter(model, Path(adapter), trainable=cfg.lora.enabled)
    elif cfg.lora.enabled and not is_peft_model(model):
        model = apply_lora(model, cfg, seed=seed)
    return model, tok
