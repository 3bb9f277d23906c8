"""The session's small parts, in process: signal handling, the zero-gradient check's advantage
test, the reflection rate (they were only reached by subprocess tests, which the
mutation run cannot see)."""

from __future__ import annotations

import math
import signal
import threading

import pytest
import torch

from replayrl.data.rollout_record import Rollout
from replayrl.errors import RunStopped
from replayrl.run.session import (
    STOP_SIGNALS,
    InterruptOnSignal,
    StopOnSignal,
    _advantages_nonzero,
    reflection_rate,
    signal_name,
)


def _sentinel(signum: int, frame: object) -> None:  # a handler the tests install and expect back
    raise AssertionError(f"sentinel handler called for {signum}")


@pytest.fixture
def sentinel_handlers():
    before = {sig: signal.signal(sig, _sentinel) for sig in STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_stop_signals_are_int_term_hup():
    assert STOP_SIGNALS == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def test_signal_name_names_known_signals_and_numbers_unknown_ones():
    assert signal_name(signal.SIGTERM) == "SIGTERM"
    assert signal_name(signal.SIGHUP) == "SIGHUP"
    assert signal_name(12345) == "signal 12345"


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_first_signal_asks_to_stop_second_aborts(sig, sentinel_handlers, capsys):
    aborted: list[int] = []  # the default ends this process (abort_now: a subprocess test)
    with StopOnSignal(abort=aborted.append) as stop:
        assert not stop.requested and stop.signum == signal.SIGINT
        signal.raise_signal(sig)
        assert stop.requested and stop.signum == sig
        out = capsys.readouterr().out
        assert f"{signal_name(sig)}: stopping after this step" in out
        assert aborted == []
        signal.raise_signal(sig)
        assert aborted == [sig]
    # every stop signal gets its previous handler back
    assert all(signal.getsignal(s) is _sentinel for s in STOP_SIGNALS)


def test_stop_handler_catches_every_stop_signal_inside(sentinel_handlers):
    with StopOnSignal() as stop:
        for s in STOP_SIGNALS:
            assert signal.getsignal(s) == stop._handle


def test_interrupt_on_signal_raises_for_term_and_hup_and_leaves_int(sentinel_handlers):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with InterruptOnSignal():
            assert signal.getsignal(signal.SIGINT) is _sentinel  # Ctrl-C stays Python's own
            with pytest.raises(RunStopped) as err:
                signal.raise_signal(sig)
            assert err.value.signum == sig
        assert signal.getsignal(sig) is _sentinel


def test_signal_guards_do_nothing_off_the_main_thread(sentinel_handlers):
    seen = []

    def body():
        with StopOnSignal(), InterruptOnSignal():
            seen.append([signal.getsignal(s) for s in STOP_SIGNALS])

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [[_sentinel] * 3]


def _rollout(advantage: float) -> Rollout:
    z = torch.zeros(1, dtype=torch.int64)
    return Rollout(z, z, torch.zeros(1), 0.0, advantage, False, 0, 0, 0)


def test_advantages_nonzero_prefers_the_learners_abs_max():
    # GAE: each rollout's own advantage is 0, the learner's per-token maximum is what counts
    assert _advantages_nonzero([_rollout(0.0)], {"advantage_abs_max": 0.3})
    assert not _advantages_nonzero([_rollout(0.5)], {"advantage_abs_max": 1e-7})
    # group estimators: the rollouts' stored advantages; the threshold is 1e-6, not 0
    assert _advantages_nonzero([_rollout(0.0), _rollout(-2e-6)], {})
    assert not _advantages_nonzero([_rollout(0.0), _rollout(5e-7)], {})
    assert not _advantages_nonzero([], {})


def test_reflection_rate_share_of_completions_with_a_word_case_blind():
    texts = ["Wait, 3+4=7", "so 12", "let me CHECK", "wait and check"]
    assert reflection_rate(texts, ["wait", "Check"]) == 3 / 4
    assert reflection_rate(texts, ["recheck"]) == 0.0
    assert math.isnan(reflection_rate([], ["wait"]))
    assert math.isnan(reflection_rate(texts, []))


def test_interrupted_checkpoints_logs_the_signal_and_raises_it(tmp_path):
    from replayrl.run.session import Session
    from replayrl.run.state import accounting
    from tiny import tiny_config

    cfg = tiny_config(tmp_path, "rewards=[{name: digits_format}]")
    (tmp_path / "run").mkdir()
    logs: list[str] = []
    s = Session(cfg, tmp_path / "run", log=logs.append)
    closed = []
    progress = type("P", (), {"close": lambda self: closed.append(True)})()
    with pytest.raises(RunStopped) as err:
        s.interrupted(progress, signal.SIGTERM)  # type: ignore[arg-type]
    assert err.value.signum == signal.SIGTERM and closed == [True]
    assert any("interrupted at step 0 (SIGTERM): checkpoint written" in x for x in logs), logs
    assert any((tmp_path / "run" / "checkpoints").iterdir())
    # the run's ledger as the session reports it: its own config, counters and buffers
    acc = s.accounting()
    assert acc == accounting(s.cfg, s.counters, s.buffers())
    assert acc["ledger"]["balanced"]


def test_sync_step_times_generation_without_reward_time_and_records_mu(tmp_path, monkeypatch):
    # one synchronous step's clocks: generation = the produce call less the reward functions'
    # share (time/reward_s), summed into the run's generation seconds; mu = generation per
    # generated rollout / training per trained rollout (paper 1), one value per step; the
    # step's wall time adds to the run's
    import time

    from replayrl.design.theory import cost_ratio
    from replayrl.run.loops.sync import sync_step
    from replayrl.run.metrics import Progress
    from replayrl.run.session import Session
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path, "rewards=[{name: digits_format}]", "train.steps=3", "train.epochs=2"
    )
    (tmp_path / "run").mkdir()
    s = Session(cfg, tmp_path / "run", log=lambda _: None)
    s.start()
    import replayrl.run.loops.sync as sync_recipe
    from tiny import produce_fresh_of

    calls, ends = [], []

    def slow_produce():
        t0 = time.perf_counter()
        time.sleep(0.6)
        rollouts, stats = produce_fresh_of(s)
        stats["time/reward_s"] = 0.4  # as if reward functions took 0.4 s of it
        calls.append((time.perf_counter() - t0, len(rollouts)))
        return rollouts, stats

    end_step = s.end_step

    def recording_end_step(stats, progress):
        end_step(stats, progress)
        ends.append(dict(stats))

    monkeypatch.setattr(sync_recipe, "produce_fresh", lambda *parts: slow_produce())
    s.end_step = recording_end_step  # type: ignore[method-assign]
    progress = Progress(3, 0, False)
    c = s.counters
    for k in range(3):
        gen_before, wall_before = c.generation_seconds, c.wall_seconds
        t0 = time.perf_counter()
        sync_step(s, progress)
        step_wall = time.perf_counter() - t0
        produced_s, n_fresh = calls[-1]
        t_gen = ends[-1]["time/generation_s"]
        # within 0.2 s (a loaded machine's pauses); a sign error on the reward time is 0.8 s off
        assert produced_s - 0.4 <= t_gen <= produced_s - 0.4 + 0.2, (t_gen, produced_s)
        assert c.generation_seconds == pytest.approx(gen_before + t_gen)
        assert produced_s <= c.wall_seconds - wall_before <= step_wall
        assert ends[-1]["wall_seconds"] == c.wall_seconds
        assert len(c.mu_per_step) == k + 1 and c.step == k + 1
        trained = ends[-1]["batch/batch_size"] * cfg.train.epochs
        want = cost_ratio(t_gen, n_fresh, ends[-1]["time/training_s"], trained)
        assert want is not None and c.mu_per_step[-1] == pytest.approx(want, rel=1e-6)
    progress.close()


def test_resolve_design_samples_with_replacement_only_when_b_exceeds_n():
    from replayrl.config.schema import load_config
    from replayrl.run.loops.auto import resolve_design

    auto = load_config("replay", ["buffer.capacity=auto", "train.batch_size=auto"])
    assert not auto.buffer.with_replacement
    for n, b, replace in ((64, 32, False), (64, 64, False), (64, 65, True)):
        new = resolve_design(auto, n, b)
        assert (new.buffer.capacity, new.batch_size, new.buffer.with_replacement) == (n, b, replace)
        # the saved config's x, y describe the buffer it runs (not the preset's 4 and 2)
        R = auto.rollouts_per_step
        assert (new.buffer.staleness_horizon, new.buffer.replay_ratio) == (n / R, b / R)
    assert auto.buffer.capacity == "auto"  # a copy: the session's own config is not changed
    already = load_config(
        "replay", ["buffer.capacity=auto", "train.batch_size=auto", "buffer.with_replacement=true"]
    )
    assert resolve_design(already, 64, 32).buffer.with_replacement  # a user's choice is kept


def _checker(patience: int):
    from types import SimpleNamespace

    from replayrl.config.schema import load_config
    from replayrl.run.session import Session

    cfg = load_config("grpo", [f"train.failure_patience={patience}", "train.lr=0.001"])
    fake = SimpleNamespace(cfg=cfg, failed_steps=0)
    return fake, lambda batch, m, step: Session.check_training(fake, batch, m, step)


def test_check_training_stops_after_patience_steps_that_trained_nothing():
    from replayrl.errors import RunFailed

    fake, check = _checker(2)
    check([], {"skipped_updates": 1.0}, 1)
    assert fake.failed_steps == 1
    check([], {"skipped_updates": 0.0, "grad_norm": 0.3}, 2)  # a real update resets the count
    assert fake.failed_steps == 0
    check([], {"skipped_updates": 1.0}, 3)
    with pytest.raises(RunFailed) as err:
        check([], {"skipped_updates": 1.0}, 4)
    assert str(err.value) == (
        "nothing was trained for 2 steps in a row (up to step 4): every update was skipped "
        "because the gradient was not finite (NaN/inf): damaged policy weights, rewards too "
        "large for the training dtype, or train.lr=0.001 too high"
    )
    fake, check = _checker(1)
    check([_rollout(0.0)], {"grad_norm": 0.0}, 1)  # zero gradient, zero advantages: fine
    assert fake.failed_steps == 0
    with pytest.raises(RunFailed, match="gradient was exactly 0 although the batch's advantages"):
        check([_rollout(1.0)], {"grad_norm": 0.0}, 2)


def test_check_training_off_and_without_metrics_does_nothing():
    fake, check = _checker(0)  # failure_patience = 0: the check is off
    for step in range(1, 5):
        check([], {"skipped_updates": 1.0}, step)
    assert fake.failed_steps == 0
    fake, check = _checker(1)
    check([], {}, 1)  # a step without learner metrics (nothing trained by design)
    assert fake.failed_steps == 0


# survivors of a random sample of the wiring scope's mutants


def _session(tmp_path, *extra: str, config: str | None = None):
    from replayrl.run.session import Session
    from tiny import tiny_config

    cfg = tiny_config(tmp_path, "rewards=[{name: digits_format}]", *extra, config=config)
    (tmp_path / "run").mkdir()
    s = Session(cfg, tmp_path / "run", log=lambda _: None)
    s.start()
    return s


@pytest.mark.parametrize(("preset", "frozen"), [("ppo", [True, True, False]), (None, [False] * 3)])
def test_policy_frozen_only_during_a_critics_warmup(tmp_path, preset, frozen):
    # critic.warmup_steps = 2: PPO trains only its critic for the first two steps; a run
    # without a critic (GRPO) never freezes its policy, whatever the key says
    from replayrl.run.loops.sync import sync_step
    from replayrl.run.metrics import Progress

    s = _session(tmp_path, "critic.warmup_steps=2", "train.steps=3", config=preset)
    seen, train_step = [], s.learner.train_step

    def recording(*args, **kwargs):
        seen.append(kwargs["policy_frozen"])
        return train_step(*args, **kwargs)

    s.learner.train_step = recording  # type: ignore[method-assign]
    progress = Progress(3, 0, False)
    for _ in range(3):
        sync_step(s, progress)
    progress.close()
    assert seen == frozen


def test_learn_with_nothing_to_train_still_makes_one_new_version(tmp_path):
    import time

    from tiny import learn_on

    s = _session(tmp_path)
    v, loaded = s.learner.version, []
    # an engine holding its own weights copy (vLLM) gets every new version

    class Engine:
        def load_weights(self, params, version):
            loaded.append(version)

    s.engine = Engine()
    stats: dict[str, float] = {}
    t0 = time.perf_counter()
    seconds = learn_on(s, [], 1, [], stats)
    assert 0.0 <= seconds <= time.perf_counter() - t0
    assert stats["time/training_s"] == seconds and s.counters.training_seconds == seconds
    assert s.learner.version == v + 1 and loaded == [v + 1]


def test_a_steps_checks_and_signal_get_the_steps_own_number(tmp_path):
    from replayrl.run.loops.sync import sync_step
    from replayrl.run.metrics import Progress

    s = _session(tmp_path, "train.steps=2")
    assert s.failed_steps == 0  # check_training counts from zero
    checked, watched = [], []
    check, watch = s.check_training, s.watch_signal
    s.check_training = lambda b, m, step: (checked.append(step), check(b, m, step))  # type: ignore[method-assign]
    s.watch_signal = lambda f, st, step: (watched.append(step), watch(f, st, step))  # type: ignore[method-assign]
    progress = Progress(2, 0, False)
    for _ in range(2):
        sync_step(s, progress)
    progress.close()
    assert checked == watched == [1, 2]


def test_produce_reports_reward_timeouts_and_evaluate_renders_like_training(tmp_path, monkeypatch):
    import replayrl.run.session as session_module
    from tiny import produce_fresh_of

    s = _session(tmp_path)
    _, stats = produce_fresh_of(s)
    assert stats["rollouts/dropped_reward_timeout"] == 0.0
    seen = []
    monkeypatch.setattr(
        session_module, "evaluate_policy", lambda *args: seen.append(args) or {"x": 1.0}
    )
    assert s.evaluate() == {"x": 1.0}
    assert seen == [(s.cfg, s.generator, s.task, s.eval_rows, s.render)]


def test_a_run_without_held_out_prompts_trains_and_logs_without_accuracy(tmp_path):
    from replayrl.run.loops.sync import run_sync

    s = _session(tmp_path, "task.eval_size=0", "train.steps=2")
    assert s.eval_rows == []
    summary = run_sync(s)
    assert s.counters.step == 2 and summary["evals"] == []
