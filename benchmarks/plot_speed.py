"""Plot `replayrl bench speed --json` output: tokens per second of each variant, one panel
per section (generation, learner, GRPO step), with the machine in the title.

    cd benchmarks/results/speed
    python ../../plot_speed.py intel-amx-2026-12-01-generation-quieter.json \
        --out intel-amx-2026-12-01-generation-quieter.png

Several JSON files may be given (e.g. a generation run and a learner run on one machine);
their rows are drawn together and the first file's machine names the figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def sections(files: list[dict[str, Any]]) -> dict[str, list[tuple[str, float]]]:
    """section -> [(variant, tokens per second)] in the order the runs measured them."""
    out: dict[str, list[tuple[str, float]]] = {}
    for data in files:
        for row in data.get("rows", []):
            if row.get("tok_s"):
                out.setdefault(row["section"], []).append((row["variant"], float(row["tok_s"])))
    return out


def plot(groups: dict[str, list[tuple[str, float]]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.6), squeeze=False)
    for ax, (section, rows) in zip(axes[0], groups.items(), strict=True):
        names = [n for n, _ in rows]
        values = [v for _, v in rows]
        ax.barh(range(len(rows)), values, color="tab:blue")
        ax.set_yticks(range(len(rows)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens / s")
        ax.set_title(section)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, nargs="+", help="`replayrl bench speed --json` files")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    files = [json.loads(p.read_text()) for p in args.json]
    machine = files[0].get("machine", {})
    title = (
        f"{machine.get('cpu', '?')}, {machine.get('threads', '?')} thread(s) of "
        f"{machine.get('cores', '?')} cores, torch {machine.get('torch', '?')}"
    )
    plot(sections(files), title, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
