"""Where the generated rollouts go, per method and per quarter of training: which of them sit
in zero-advantage groups (all-correct and all-wrong apart), which are never trained with a
non-zero advantage, how much gradient signal each generated token buys once reuse is counted,
and how much of what is trained is replayed and how stale it is.

It reads run folders (not the committed records, whose per-step spans do not split
all-correct from all-wrong groups): each run's `metrics.jsonl` and a full `completions.jsonl`,
which a suite writes when every rollout is logged at every step:

    replayrl bench suite heldout --tasks add6 --seeds 0 --only grpo-p16 remix-grpo ar3po \\
        dapo replay-posbias --set logging.completions=1000000 logging.completions_every=1 \\
        --out RUNS --results RECORDS
    python benchmarks/rollout_waste.py \\
        --run add6/grpo=RUNS/heldout/add6/grpo-p16-s0 add6/remix-grpo=... \\
        --json waste.json --markdown waste.md --out waste.png

What each column means (per quarter of the run's generated rollouts; a step counts in the
quarter its cumulative count ends in):

- `zero-adv (right / wrong)`: share of the generated rollouts whose fresh group's rewards are
  all equal, split into groups that are all correct and all wrong (the verifier's `correct`).
- `never used`: share of generated completion tokens that no update ever trained with a
  non-zero advantage, until the run's end (a reused correct response can still give an
  all-wrong group signal, as AR3PO's does; a dropped group, as DAPO's, is never trained).
- `unlogged`: share of generated rollouts the log never shows: neither in the step's first
  generation call nor trained (DAPO's groups dropped from its later calls). They count as
  never used; the zero-advantage shares, read from the log, leave them out.

A rollout counts as generated at the step it is logged with age 0 (policy versions between
its weights and the step's): AR3PO's earlier rounds and DAPO's later calls reach the log only
through the batch, marked "replayed", but were generated with the step's weights.
- `signal/gen token`: completion tokens trained with a non-zero advantage, once per pass and
  per time a rollout is drawn (so reuse counts), per generated token. The step's passes are
  its `tokens_trained` over the tokens of the distinct rollouts its batch logged.
- `fresh / replayed signal`: the same split by the rollout's origin in that step's batch.
- `replayed`: share of trained tokens that were replayed (`train/off_policy/tokens`);
  `staleness`: mean age of the batch in policy versions; `ESS`: the batch's effective sample
  size over N.

A rollout is recognised across steps by (prompt, completion, policy version); identical
completions of one group share their reward and advantage, so the key is enough.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZERO = 1e-8  # advantages and reward spreads below this are zero
QUARTERS = 4


@dataclass
class StepCounts:
    """One step's counts: what it generated and what its batch trained."""

    step: int
    cum_rollouts: float = 0.0
    rollouts: float = 0.0
    tokens: float = 0.0
    all_right_rollouts: float = 0.0
    all_wrong_rollouts: float = 0.0
    all_right_tokens: float = 0.0
    all_wrong_tokens: float = 0.0
    signal_fresh: float = 0.0  # non-zero-advantage token passes on rollouts of this step
    signal_replayed: float = 0.0  # ... on rollouts generated at earlier steps
    replayed_logged: float = 0.0  # tokens of the distinct earlier rollouts the batch trained
    replayed_zero: float = 0.0  # ... of them with a zero advantage
    trained_tokens: float = 0.0
    replayed: float | None = None
    staleness: float | None = None
    ess: float | None = None
    generation_s: float = 0.0
    training_s: float = 0.0
    # generated but never logged: not trained, nor in the step's first generation call (DAPO's
    # groups dropped from its later calls)
    unlogged_rollouts: float = 0.0
    unlogged_tokens: float = 0.0
    fresh_keys: list[tuple[tuple[str, str, int], int]] = field(default_factory=list)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (a last line cut short by a crash is skipped)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _key(rec: dict[str, Any]) -> tuple[str, str, int]:
    return (str(rec["prompt"]), str(rec["completion"]), int(rec["policy_version"]))


def _age(rec: dict[str, Any]) -> int:
    """Policy versions between the weights that generated a logged rollout and its step's."""
    if rec.get("age") is not None:
        return int(rec["age"])
    return 0 if rec.get("origin") == "fresh" else 1


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def step_counts(
    metrics: list[dict[str, Any]], completions: list[dict[str, Any]]
) -> tuple[list[StepCounts], set[tuple[str, str, int]]]:
    """Per training step its counts, and the keys of every rollout some update trained with a
    non-zero advantage (the run's "used" rollouts)."""
    rows = {int(r["step"]): r for r in metrics if "rollouts_generated" in r}
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in completions:
        by_step[int(c["step"])].append(c)
    used: set[tuple[str, str, int]] = set()
    out: list[StepCounts] = []
    prev = {"rollouts_generated": 0.0, "tokens_generated": 0.0, "tokens_trained": 0.0}
    for step in sorted(rows):
        row = rows[step]
        sc = StepCounts(step=step, cum_rollouts=float(row["rollouts_generated"]))
        sc.rollouts = float(row["rollouts_generated"]) - prev["rollouts_generated"]
        sc.tokens = float(row["tokens_generated"]) - prev["tokens_generated"]
        sc.trained_tokens = float(row.get("tokens_trained") or 0) - prev["tokens_trained"]
        for k in prev:
            prev[k] = float(row.get(k) or prev[k])
        on, off = _num(row.get("train/on_policy/tokens")), _num(row.get("train/off_policy/tokens"))
        if on is not None or off is not None:
            total = (on or 0.0) + (off or 0.0)
            sc.replayed = (off or 0.0) / total if total else None
        sc.staleness = _num(row.get("batch/age_mean"))
        sc.ess = _num(row.get("train/ess"))
        sc.generation_s = _num(row.get("time/generation_s")) or 0.0
        sc.training_s = _num(row.get("time/training_s")) or 0.0

        recs = by_step.get(step, [])
        # generated this step: age 0 (AR3PO's earlier rounds and DAPO's later calls reach the
        # log through the batch, as "replayed", but were generated with this step's weights)
        fresh = [r for r in recs if _age(r) == 0]
        groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in fresh:
            groups[r.get("group")].append(r)
            sc.fresh_keys.append((_key(r), int(r.get("completion_tokens") or 0)))
        for members in groups.values():
            rewards = [_num(m.get("reward")) for m in members]
            vals = [r for r in rewards if r is not None]
            if len(members) < 2 or not vals or max(vals) - min(vals) > ZERO:
                continue
            toks = sum(int(m.get("completion_tokens") or 0) for m in members)
            if all(m.get("correct") for m in members):
                sc.all_right_rollouts += len(members)
                sc.all_right_tokens += toks
            elif not any(m.get("correct") for m in members):
                sc.all_wrong_rollouts += len(members)
                sc.all_wrong_tokens += toks
        sc.unlogged_rollouts = max(0.0, sc.rollouts - len(fresh))
        sc.unlogged_tokens = max(0.0, sc.tokens - sum(t for _, t in sc.fresh_keys))
        trained = [r for r in recs if r.get("trained")]
        logged = sum(int(r.get("completion_tokens") or 0) for r in trained)
        passes = sc.trained_tokens / logged if logged else 0.0
        for r in trained:
            adv = _num(r.get("advantage"))
            if _age(r) > 0:
                sc.replayed_logged += int(r.get("completion_tokens") or 0)
                if adv is None or abs(adv) <= ZERO:
                    sc.replayed_zero += int(r.get("completion_tokens") or 0)
            if adv is None or abs(adv) <= ZERO:
                continue
            used.add(_key(r))
            toks = passes * int(r.get("completion_tokens") or 0)
            if _age(r) == 0:
                sc.signal_fresh += toks
            else:
                sc.signal_replayed += toks
        out.append(sc)
    return out, used


def screening(completions: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """What stopping a prompt after its first `first` completions, when they all agree, would
    have done to the run's own full groups, per quarter of its steps: the share of generated
    rollouts saved, the share of signal groups (reward variance over the full group) lost, and
    signal groups per generated rollout before and after. Completions of a group are taken in
    the order logged (generation order); only groups of more than `first` count. A run whose
    groups differ in size (AR3PO's rounds, logged out of generation order) has none: []."""
    groups: dict[tuple[int, Any], list[bool]] = defaultdict(list)
    for c in completions:
        if _age(c) == 0:
            groups[(int(c["step"]), c.get("group"))].append(bool(c.get("correct")))
    if len({len(v) for v in groups.values()}) != 1:
        return []
    last = max(step for step, _ in groups)
    out = []
    for q in range(QUARTERS):
        sel = [
            v
            for (step, _), v in groups.items()
            if q / QUARTERS < step / last <= (q + 1) / QUARTERS and len(v) > first
        ]
        spent = sum(len(v) for v in sel)
        stopped = [v for v in sel if len(set(v[:first])) == 1]
        saved = sum(len(v) - first for v in stopped)
        mixed = sum(len(set(v)) > 1 for v in sel)
        lost = sum(len(set(v)) > 1 for v in stopped)
        out.append(
            {
                "groups": len(sel),
                "saved": saved / spent if spent else None,
                "signal_lost": lost / mixed if mixed else None,
                "signal_per_rollout": mixed / spent if spent else None,
                "screened_signal_per_rollout": (mixed - lost) / (spent - saved)
                if spent > saved
                else None,
            }
        )
    return out


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def summarise(steps: list[StepCounts], used: set[tuple[str, str, int]]) -> dict[str, Any]:
    """The run's shares in all and per quarter of its generated rollouts."""
    total = sum(s.rollouts for s in steps)

    def block(sel: list[StepCounts]) -> dict[str, Any]:
        roll = sum(s.rollouts for s in sel)
        tok = sum(s.tokens for s in sel)
        unlogged_tok = sum(s.unlogged_tokens for s in sel)
        unused_tok = unlogged_tok + sum(t for s in sel for k, t in s.fresh_keys if k not in used)
        sig_f = sum(s.signal_fresh for s in sel)
        sig_r = sum(s.signal_replayed for s in sel)

        def share(x: float, of: float) -> float | None:
            return x / of if of else None

        return {
            "rollouts": roll,
            "tokens": tok,
            "zero_adv_rollouts": share(
                sum(s.all_right_rollouts + s.all_wrong_rollouts for s in sel), roll
            ),
            "all_right_rollouts": share(sum(s.all_right_rollouts for s in sel), roll),
            "all_wrong_rollouts": share(sum(s.all_wrong_rollouts for s in sel), roll),
            "all_right_tokens": share(sum(s.all_right_tokens for s in sel), tok),
            "all_wrong_tokens": share(sum(s.all_wrong_tokens for s in sel), tok),
            "never_used_tokens": share(unused_tok, tok),
            "unlogged_rollouts": share(sum(s.unlogged_rollouts for s in sel), roll),
            "signal_per_token": share(sig_f + sig_r, tok),
            "fresh_signal_per_token": share(sig_f, tok),
            "replayed_signal_per_token": share(sig_r, tok),
            "trained_per_token": share(sum(s.trained_tokens for s in sel), tok),
            "replayed": _mean([s.replayed for s in sel]),
            "replayed_zero_adv": share(
                sum(s.replayed_zero for s in sel), sum(s.replayed_logged for s in sel)
            ),
            "staleness": _mean([s.staleness for s in sel]),
            "ess": _mean([s.ess for s in sel]),
            "generation_s": sum(s.generation_s for s in sel),
            "training_s": sum(s.training_s for s in sel),
        }

    quarters = []
    for q in range(QUARTERS):
        sel = [
            s
            for s in steps
            if total and q / QUARTERS < s.cum_rollouts / total <= (q + 1) / QUARTERS
        ]
        quarters.append(block(sel))
    return {"all": block(steps), "quarters": quarters}


def analyse_run(folder: Path, screen: int | None = None) -> dict[str, Any]:
    """A run folder's summary (metrics.jsonl and a completions.jsonl that logs every rollout),
    with `screen`: the screening counterfactual at that first round (`screening`)."""
    metrics = read_jsonl(folder / "metrics.jsonl")
    completions = read_jsonl(folder / "completions.jsonl")
    steps, used = step_counts(metrics, completions)
    out = summarise(steps, used)
    # a log that misses generated rollouts (DAPO's dropped calls) holds a biased sample of
    # the groups: no counterfactual from it
    if screen and not any(s.unlogged_rollouts for s in steps):
        out["screening"] = {"first": screen, "quarters": screening(completions, screen)}
    return out


def screening_table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown: the screening counterfactual of each run that has one, per quarter."""
    lines = [
        "| task | method | first round | part | rollouts saved | signal groups lost | signal "
        "groups per rollout: run / screened |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, methods in results.items():
        for method, res in methods.items():
            sc = res.get("screening")
            for i, q in enumerate(sc["quarters"] if sc else []):
                if not q["groups"]:
                    continue
                lines.append(
                    f"| {task} | {method} | {sc['first']} | Q{i + 1} | {_fmt(q['saved'])} | "
                    f"{_fmt(q['signal_lost'])} | {_fmt3(q['signal_per_rollout'])} / "
                    f"{_fmt3(q['screened_signal_per_rollout'])} |"
                )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x:.0%}" if pct else f"{x:.2f}"


def _fmt3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown: one row per task, method and quarter (Q1-Q4), then the whole run."""
    lines = [
        "| task | method | part | zero-adv rollouts (right / wrong) | never-used tokens | "
        "unlogged | signal / gen token (fresh + replayed) | trained / gen token | replayed "
        "(of it zero-adv) | staleness | ESS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, methods in results.items():
        for method, res in methods.items():
            parts = [*(f"Q{i + 1}" for i in range(QUARTERS)), "all"]
            for part, b in zip(parts, [*res["quarters"], res["all"]], strict=True):
                lines.append(
                    f"| {task} | {method} | {part} | {_fmt(b['zero_adv_rollouts'])} "
                    f"({_fmt(b['all_right_rollouts'])} / {_fmt(b['all_wrong_rollouts'])}) | "
                    f"{_fmt(b['never_used_tokens'])} | {_fmt(b['unlogged_rollouts'])} | "
                    f"{_fmt(b['signal_per_token'], False)} "
                    f"({_fmt(b['fresh_signal_per_token'], False)} + "
                    f"{_fmt(b['replayed_signal_per_token'], False)}) | "
                    f"{_fmt(b['trained_per_token'], False)} | {_fmt(b['replayed'])} "
                    f"({_fmt(b['replayed_zero_adv'])}) | "
                    f"{_fmt(b['staleness'], False)} | {_fmt(b['ess'], False)} |"
                )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, dict[str, Any]]], out: Path) -> None:
    """One row per task: zero-advantage shares (stacked: all wrong below, all right above),
    never-used tokens, signal per generated token, replayed share, by quarter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results)
    methods = list(dict.fromkeys(m for t in tasks for m in results[t]))
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(tasks), 4, figsize=(16, 3.2 * len(tasks)), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    xs = list(range(QUARTERS))
    for row, task in zip(axes, tasks, strict=True):
        for i, m in enumerate(methods):
            res = results[task].get(m)
            if res is None:
                continue
            qs = res["quarters"]
            pos = [x - 0.4 + width * (i + 0.5) for x in xs]
            wrong = [q["all_wrong_rollouts"] or 0.0 for q in qs]
            right = [q["all_right_rollouts"] or 0.0 for q in qs]
            row[0].bar(pos, wrong, width, color=colours[m], label=m)
            row[0].bar(pos, right, width, bottom=wrong, color=colours[m], alpha=0.35, hatch="//")
            for ax, key in ((row[1], "never_used_tokens"), (row[2], "signal_per_token")):
                ax.plot(xs, [q[key] for q in qs], marker="o", color=colours[m], label=m)
            row[3].plot(xs, [q["replayed"] for q in qs], marker="o", color=colours[m], label=m)
        titles = (
            "zero-adv share of generated rollouts\n(solid: all wrong, hatched: all right)",
            "generated tokens never trained\nwith a non-zero advantage",
            "non-zero-advantage tokens trained\nper generated token (reuse counted)",
            "replayed share of trained tokens",
        )
        for ax, title in zip(row, titles, strict=True):
            ax.set_title(f"{task}: {title}", fontsize=8)
            ax.set_xticks(xs, [f"Q{x + 1}" for x in xs])
            ax.tick_params(labelsize=7)
        for ax in (row[0], row[1], row[3]):
            ax.set_ylim(0, 1)
        row[2].set_ylim(bottom=0)
        row[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=60)
    plt.close(fig)


def _rounded(x: Any) -> Any:
    """Floats to 4 significant digits, all the way down (a small file to commit)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def parse_run(spec: str) -> tuple[str, str, Path]:
    """`task/method=FOLDER` -> (task, method, folder)."""
    label, sep, folder = spec.partition("=")
    task, slash, method = label.partition("/")
    if not sep or not slash or not task or not method or not folder:
        raise argparse.ArgumentTypeError(f"expected task/method=FOLDER, got {spec!r}")
    return task, method, Path(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", nargs="+", type=parse_run, required=True, metavar="TASK/METHOD=DIR")
    p.add_argument("--json", type=Path, help="write the summaries here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--out", type=Path, help="the figure (PNG)")
    p.add_argument(
        "--screen",
        type=int,
        metavar="K",
        help="also the counterfactual of stopping a prompt after K agreeing completions",
    )
    args = p.parse_args(argv)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    missing = []
    for task, method, folder in args.run:
        if not (folder / "completions.jsonl").exists() or not (folder / "metrics.jsonl").exists():
            missing.append(f"{task}/{method}")
            continue
        results.setdefault(task, {})[method] = analyse_run(folder, args.screen)
    if missing:
        print(f"runs without metrics.jsonl and completions.jsonl, left out: {missing}")
    if not results:
        return 2
    md = table(results)
    if args.screen:
        md += "\n" + screening_table(results)
    print(md, end="")
    if args.markdown:
        args.markdown.write_text(md)
    if args.json:
        args.json.write_text(json.dumps(_rounded(results), sort_keys=True) + "\n")
    if args.out:
        plot(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
