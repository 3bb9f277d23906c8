"""`replayrl eval`: score a model on a file (every row), a run's task, or the built-in task.

    replayrl eval --model runs/NAME/final --data questions.jsonl   # every row of the file
    replayrl eval --run runs/NAME --data questions.jsonl           # the run's latest policy
    replayrl eval --run runs/NAME                                  # the run's own eval split
    replayrl eval --out results.json                               # the built-in task

`--model` takes a model folder, a run folder (its `final/`) or a checkpoint folder (its
`policy/`). The results file goes into the run folder (`eval_<data>.json`); without a run
folder `--out` is needed.

With `--run` (or a `--model` folder inside a run folder) the run's config.yaml supplies the
prompt rendering (chat template, system prompt), `rollout.max_new_tokens` and the data
columns, so the model is scored as it was trained. It prints what it scored, pass@1 (and
pass@k with `--k`), a few completions with `--show N`, and writes a results JSON file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from replayrl.config.schema import Config, ConfigError, load_config


def find_run(args: argparse.Namespace) -> Path | None:
    """The run folder whose config applies: --run, else a --model folder's run folder."""
    if args.run:
        run = Path(args.run)
        if not (run / "config.yaml").is_file():
            raise FileNotFoundError(f"--run {run}: not a run folder (no config.yaml)")
        return run
    if args.model and not args.config:
        model = Path(args.model).resolve()
        # RUN, RUN/final, RUN/checkpoints/step_N, RUN/checkpoints/step_N/policy
        for parent in (model, model.parent, model.parent.parent, model.parent.parent.parent):
            if _is_run(parent):
                return parent
    return None


def _is_run(folder: Path) -> bool:
    return (folder / "config.yaml").is_file() and (folder / "metrics.jsonl").is_file()


def eval_config(args: argparse.Namespace, run: Path | None) -> Config:
    if run is not None and args.config:
        raise ConfigError("--run takes the run's own config.yaml; drop --config")
    cfg = load_config(run / "config.yaml" if run else args.config, args.overrides)
    if args.k is not None:
        cfg.eval.pass_k = args.k
    cfg.model.lora.enabled = False  # evaluate as it is (an adapter folder loads with its base)
    return cfg


def model_path(args: argparse.Namespace, run: Path | None) -> str | None:
    """--model (a run folder: its final/ or newest checkpoint's policy; a checkpoint folder:
    its policy/; else the folder as given), else --run's newest checkpoint's policy, else
    None (model.path)."""
    if args.model:
        model = Path(args.model)
        if _is_run(model):
            from replayrl.models.export import FINAL

            final = model / FINAL
            if final.is_dir():
                return str(final)
            return model_path(argparse.Namespace(model=None), model)
        if (model / "policy").is_dir():
            return str(model / "policy")
        return str(args.model)
    if run is not None:
        from replayrl.storage.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(run)
        if ckpt is None:
            raise FileNotFoundError(f"--run {run}: no complete checkpoint to evaluate")
        return str(ckpt / "policy")
    return None


def rows_to_score(args: argparse.Namespace, cfg: Config) -> tuple[Any, list[Any], str]:
    """(task, rows, what they are): every row of --data, else the config's held-out split."""
    from replayrl.api.trainer import IN_MEMORY
    from replayrl.config.registries import TASKS
    from replayrl.rollout.evaluation import held_out_rows
    from replayrl.rollout.tasks import DatasetTask, describe_task, task_from_config

    t = cfg.task
    task: Any
    if args.data:
        task = DatasetTask.to_score(args.data, t)
        rows = task.train_rows()
        skipped = sum(task.skipped.values())
        note = f", {skipped} rows skipped: {task.skip_summary()}" if skipped else ""
        return task, rows, f"every row of {args.data} ({len(rows)} rows{note})"
    data_file = TASKS.get(t.name).data_file
    data = data_file(t) if data_file is not None else None
    if data and data.startswith(IN_MEMORY):
        raise ConfigError(
            f"this run trained on in-memory rows ({data}); pass them as a file: --data FILE"
        )
    task = task_from_config(t)
    rows = held_out_rows(cfg, task)
    if data:
        where = f"the held-out split of {t.settings.eval_path or data}"
    else:
        where = f"the built-in task {t.name!r} ({describe_task(t)}), its held-out split"
        if not args.run and not args.config:
            where += " (no --data given: pass --data FILE to score your own rows)"
    return task, rows, f"{where}, first {len(rows)} rows"


def cmd_eval(args: argparse.Namespace) -> int:
    from replayrl.models.device import resolve_device
    from replayrl.rollout.evaluation import evaluate_policy, rows_that_fit, too_long_note
    from replayrl.rollout.prompts import PromptRenderer
    from replayrl.run.components import build_generator
    from replayrl.run.policy import load_policy

    run = find_run(args)
    if not args.out and run is None:  # refused before the model loads, not after scoring
        raise ConfigError(
            "eval: no run folder to write the results into: give --out FILE (or --run RUN, "
            "or a --model folder inside a run folder)"
        )
    cfg = eval_config(args, run)
    cfg.model.path = model_path(args, run) or cfg.model.path
    if cfg.train.threads:  # as a run would (a supervised warm-up may be built here)
        import torch

        torch.set_num_threads(cfg.train.threads)
    task, rows, what = rows_to_score(args, cfg)
    print(f"scoring: {what}")
    if run is not None:
        print(f"with the run's prompt rendering and max_new_tokens: {run / 'config.yaml'}")
    # eval.batch_size sequences at once, with the run's backend (vLLM too), on train.device
    cfg.rollout.decode_batch_size = cfg.eval.batch_size
    model, tok, path = load_policy(cfg.model, cfg.task)
    model = model.to(resolve_device(cfg.train.device))
    render = PromptRenderer(tok, cfg.task.chat_template, cfg.task.system_prompt)
    # prompts that do not fit the model with max_new_tokens are skipped and counted, as
    # training skips them: never scored as ordinary rows
    max_positions = getattr(model.config, "max_position_embeddings", None)
    new_tokens = cfg.rollout.max_new_tokens
    rows, skipped = rows_that_fit(rows, render, tok, max_positions, new_tokens)
    if skipped:
        note = too_long_note(skipped, skipped + len(rows), max_positions, new_tokens)
        if not rows:
            raise ValueError(f"nothing to score ({what}): {note}")
        print(f"warning: {note}")
    # `path`: a vLLM engine loads the evaluated weights from it
    gen = build_generator(cfg, model, tok, path, task, render)
    completions: list[dict[str, Any]] = []
    res = evaluate_policy(cfg, gen, task, rows, render, completions=completions)
    result = {
        "model": path,
        "scored": what,
        "data": str(args.data) if args.data else None,
        "run": str(run) if run is not None else None,
        "num_prompts": len(rows),
        "prompts_skipped_too_long": skipped,
        "max_new_tokens": new_tokens,
        **res,
    }
    print(json.dumps(result, indent=2))
    _show(completions, args.show)
    out = _write_results(args, run, {**result, "completions": completions})
    print(f"results: {out}")
    return 0


def _show(completions: list[dict[str, Any]], n: int) -> None:
    """The first n completions, one line each (the results file has them whole)."""
    from replayrl.run.completions import short_text

    if n <= 0:
        return
    print(f"{'correct':<8} {'answer':<10} prompt -> completion")
    for c in completions[:n]:
        mark = "yes" if c["correct"] else "no"
        print(
            f"{mark:<8} {short_text(str(c.get('answer')), 10):<10} "
            f"{short_text(str(c['prompt']), 40)} -> {short_text(str(c['completion']), 60)}"
        )


def _write_results(args: argparse.Namespace, run: Path | None, data: dict[str, Any]) -> Path:
    """--out, else eval_<data stem or task>.json in the run folder (cmd_eval refuses neither)."""
    from replayrl.storage.io import atomic_write_json

    if args.out:
        out = Path(args.out)
    else:
        assert run is not None
        stem = Path(args.data).stem if args.data else "heldout"
        out = run / f"eval_{stem}.json"
    atomic_write_json(out, data)
    return out


def add_eval_parser(sub: Any, add_config_args: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="pass@1 (and pass@k) of a model on a file (--data), a run's eval split, or the "
        "built-in task",
    )
    add_config_args(p)
    p.add_argument(
        "--model",
        help="a model folder, a run folder (its final/), or a checkpoint folder (its policy/); "
        "default: --run's latest policy",
    )
    p.add_argument("--data", help="score every row of this file (JSONL / JSON / CSV / parquet)")
    p.add_argument(
        "--run", help="a run folder: its prompt rendering, max_new_tokens, columns and policy"
    )
    p.add_argument("--k", type=int, help="also pass@k: k samples per prompt at eval.temperature")
    p.add_argument("--show", type=int, default=3, help="print this many completions (0: none)")
    p.add_argument(
        "--out",
        help="results JSON file (default: eval_<data>.json in the run folder; needed without one)",
    )
    p.set_defaults(func=cmd_eval)
