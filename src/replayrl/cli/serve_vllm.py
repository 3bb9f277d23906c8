"""`replayrl serve-vllm`: start the vLLM server a `rollout.backend=vllm_server` run generates
with (TRL's `trl vllm-serve`), on the run's own config: its model folder, the generation
dtype, vLLM's `vllm.*` engine settings, `vllm.server.host`/`port`, the log-probs the learner
recomputes and the dev-mode endpoints the weight push needs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from replayrl.config.schema import load_config
from replayrl.rollout.generation.vllm_settings import vllm_settings


def add_serve_vllm_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve-vllm",
        help="start the vLLM server of a rollout.backend=vllm_server run (TRL's vllm-serve)",
        description="Start vLLM's OpenAI-compatible server for a run's config (its model, "
        "dtype, vllm.* settings, vllm.server.host and port). Run it in an environment with "
        "vLLM; then train with the same config and rollout.backend=vllm_server.",
    )
    p.add_argument("--config", "-c", help="the run's preset or YAML file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. vllm.server.port=8001")
    p.add_argument(
        "--python",
        default=sys.executable,
        help="the Python that has vLLM installed (default: this one)",
    )
    p.add_argument(
        "--vllm-args",
        default="",
        help="more flags for vLLM's server, as one string (e.g. '--max-num-seqs 64')",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the command and its environment only"
    )
    p.set_defaults(func=_cmd_serve_vllm)


def serve_vllm_command(
    config: str | None, overrides: list[str], python: str
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the server for this config; builds the tiny model's warm
    start first when the config has no model.path and it is not cached yet."""
    from replayrl.models.loading import adapter_base, is_adapter_folder, resolve_model_path
    from replayrl.rollout.generation.vllm_server import server_command
    from replayrl.run.policy import policy_folder

    cfg = load_config(config, overrides)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    path = policy_folder(cfg.model, cfg.task, log)
    if is_adapter_folder(path):  # a LoRA adapter: the server holds its base model
        from pathlib import Path

        path = resolve_model_path(adapter_base(Path(path)))
    gen = cfg.precision.generation
    dtype = gen if gen != "auto" else cfg.model.dtype  # what the trainer's weights are in
    settings = vllm_settings(cfg)
    seed = settings.seed if settings.seed is not None else cfg.train.seed
    return server_command(settings, path, dtype, seed, python=python)


def _cmd_serve_vllm(args: argparse.Namespace) -> int:
    argv, env = serve_vllm_command(args.config, list(args.overrides), args.python)
    argv += shlex.split(args.vllm_args)
    shown = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(argv)
    print(shown, file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    # the server replaces this process: signals (Ctrl-C, SIGTERM) reach vLLM itself
    os.execvpe(argv[0], argv, {**os.environ, **env})
    return 0  # not reached
