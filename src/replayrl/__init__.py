"""replayrl: RL post-training of language models that reuses rollouts (experience replay,
arXiv 2604.08706; ReMix, arXiv 2507.06892).

The Python API, shaped like TRL's GRPOTrainer / GRPOConfig::

    from replayrl import ReplayConfig, ReplayTrainer

    trainer = ReplayTrainer(
        model="path/to/model",                  # or a PreTrainedModel (+ processing_class)
        reward_funcs=[my_reward],               # f(prompts, completions, **columns)
        args=ReplayConfig("remix-grpo", output_dir="runs/mine", max_steps=100),
        train_dataset=dataset,                  # datasets.Dataset, list of dicts, or a file
    )
    trainer.train()
    trainer.evaluate()
    trainer.save_model("my-policy")

`help(replayrl.ReplayTrainer)`, `help(replayrl.ReplayConfig)` and `help(replayrl.ReplayCallback)`
say the rest; `replayrl presets` lists the shipped presets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "Config",
    "ReplayCallback",
    "ReplayConfig",
    "ReplayTrainer",
    "load_config",
    "preset_names",
]

if TYPE_CHECKING:
    from replayrl.api.trainer import ReplayConfig, ReplayTrainer
    from replayrl.config.catalog import preset_names
    from replayrl.config.schema import Config, load_config
    from replayrl.run.callbacks import ReplayCallback

_LAZY = {
    "ReplayConfig": "replayrl.api.config",
    "ReplayTrainer": "replayrl.api.trainer",
    "ReplayCallback": "replayrl.run.callbacks",
    "preset_names": "replayrl.config.catalog",
    "Config": "replayrl.config.schema",
    "load_config": "replayrl.config.schema",
}


def __getattr__(name: str) -> Any:
    # lazy: `import replayrl` stays cheap (torch loads on first use of the API)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'replayrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
