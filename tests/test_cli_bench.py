"""`replayrl bench` as subcommands: suite | speed | buffer, each with only its own flags; the
old `replayrl bench NAME` form still runs a suite."""

from __future__ import annotations

import pytest

from replayrl.cli import main as cli


def _parse(*argv: str):
    return cli.build_parser().parse_args(cli.legacy_bench_form(list(argv)))


def test_each_bench_subcommand_reaches_its_own_command() -> None:
    args = _parse("bench", "suite", "demo-suite", "--quick", "--seeds", "0", "--jobs", "2")
    assert args.func is cli._cmd_bench_suite
    assert (args.suite, args.quick, args.seeds, args.jobs) == ("demo-suite", True, [0], 2)
    args = _parse("bench", "speed", "--threads", "1", "--sections", "grpo")
    assert args.func is cli._cmd_bench_speed and (args.threads, args.sections) == (1, ["grpo"])
    args = _parse("bench", "buffer", "--n", "100", "--batch", "8")
    assert args.func is cli._cmd_bench_buffer and (args.n, args.batch) == (100, 8)


def test_suite_evidence_flags() -> None:
    args = _parse("bench", "suite", "heldout", "--mixed", "--results", "r", "--pin-warmstarts")
    assert (args.mixed, args.results, args.pin_warmstarts) == (True, "r", True)
    args = _parse("bench", "suite", "heldout")
    assert (args.mixed, args.results, args.pin_warmstarts) == (False, None, False)


def test_the_old_form_runs_a_suite() -> None:
    args = _parse("bench", "configs/my-suite.yaml", "--quick")
    assert args.func is cli._cmd_bench_suite and args.suite == "configs/my-suite.yaml"


@pytest.mark.parametrize(
    "argv",
    [
        ("bench", "buffer", "--quick"),  # a suite flag on the buffer bench
        ("bench", "speed", "--n", "10"),  # a buffer flag on the speed bench
        ("bench", "suite", "x", "--sections", "grpo"),  # a speed flag on a suite
    ],
)
def test_flags_of_another_bench_are_rejected(argv: tuple[str, ...], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(*argv)
    assert exc.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_bench_buffer_runs_from_main(capsys) -> None:
    assert cli.main(["bench", "buffer", "--n", "200", "--batch", "8", "--repeats", "2"]) == 0
    assert "sample" in capsys.readouterr().out
