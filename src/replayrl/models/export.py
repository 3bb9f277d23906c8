"""`replayrl export`: a run's policy as a plain model folder (LoRA merged into the weights)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from replayrl.models.loading import (
    adapter_base,
    atomic_folder,
    atomic_save_pretrained,
    attach_adapter,
    is_adapter_folder,
    load_pretrained,
    resolve_model_path,
)
from replayrl.storage.checkpoint import latest_checkpoint


def resolve_checkpoint(src: Path) -> Path:
    """A run folder (its latest checkpoint), a checkpoint folder, or a policy folder."""
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
    policy = resolve_checkpoint(Path(src).expanduser())
    dest = Path(out).expanduser()
    if is_adapter_folder(policy):
        base = resolve_model_path(adapter_base(policy))
        model, tok = load_pretrained(base, dtype)
        adapted: Any = attach_adapter(model, policy, trainable=False)  # a peft PeftModel
        model = adapted.merge_and_unload()
        if (policy / "tokenizer_config.json").is_file():  # the run's tokenizer (pad, side)
            tok = AutoTokenizer.from_pretrained(policy)
    elif (policy / "config.json").is_file():
        model, tok = load_pretrained(str(policy), dtype)
    else:
        raise FileNotFoundError(f"{policy}: neither a LoRA adapter nor a model folder")
    atomic_save_pretrained(model, tok, dest)
    return dest


FINAL = "final"  # the run's last policy as a plain model folder: runs/NAME/final


def write_final(policy: Path, run_dir: Path, dtype: str = "float32") -> Path:
    """`run_dir/final`: the policy folder of the run's last checkpoint as a folder that
    `from_pretrained` opens (a LoRA adapter merged into its base's weights, as TRL's
    `save_model` of a merged model); written atomically, replacing an older one."""
    dest = run_dir / FINAL
    if is_adapter_folder(policy):
        return export_merged(policy, dest, dtype=dtype)
    atomic_folder(dest, lambda tmp: shutil.copytree(policy, tmp, dirs_exist_ok=True))
    return dest
