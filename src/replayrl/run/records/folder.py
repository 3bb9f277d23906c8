"""Run folders that a failed start or resume never loses.

- A new run over an existing folder (`logging.overwrite=true`) first moves the old run
  aside (a hidden sibling `.<name>.replaced-<pid>`); the old run is deleted only once the
  new one has started (model, data and rewards loaded), and is put back if the start fails.
- A resume checks its overrides against the run's saved config before anything is written,
  and the run's `config.yaml` is rewritten (atomically) only after the resumed trainer has
  restored its checkpoint, so a refused override never bricks later resumes.
- One process per run folder: `run_lock` takes an exclusive lock (`.<name>.lock` beside the
  folder, holding the owner's pid) before anything is written; a second start or resume of
  the same folder is refused. The lock is a kernel `flock`, released when its process ends
  however it ends, so a file left by a killed run is stale and never blocks.
- Overwrite only ever replaces a replayrl run folder (`is_run_folder`), never a symlink, and
  `logging.name` is a plain folder name (schema), so nothing outside `run_dir/<name>` is
  deleted; a symlinked `checkpoints/` is refused (pruning would follow it into another run).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from replayrl.config.method_sections import place_method_keys
from replayrl.config.registries import METHODS, TASKS
from replayrl.config.schema import Config, ConfigError, TaskConfig, config_to_yaml, load_config
from replayrl.errors import RunFailed
from replayrl.run.records.run_record import Verdict, reward_refs, sign_or_warn, verify_run_folder
from replayrl.storage.checkpoint import CheckpointWriteError, find_checkpoints, manifest_config
from replayrl.storage.io import atomic_write_text

Log = Callable[[str], None]

# config keys a checkpoint's contents depend on: the policy weights, the buffer's layout,
# the method (its own state's keys: its registry entry) and the learners' shards. Changing them
# on resume is refused.
FROZEN_ON_RESUME = (
    "model.path",
    "model.dtype",
    "model.lora",
    "model.tiny",
    "model.warmstart",
    "buffer.capacity",
    "buffer.sampler",
    "buffer.num_shards",
    "algorithm.advantage",
    "runtime",
    "workers.learners",
    "method.name",  # the method's own state (stores, windows, carried groups) is checkpointed
)


def frozen_on_resume(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys a resume may not change: the run-wide ones above, then those the method and
    the task declare in their registry entries (`frozen_on_resume`), for the method and task
    of either side (a record without them: the defaults)."""
    keys = list(FROZEN_ON_RESUME)
    default = Config().model_dump(mode="json")
    for side in (saved, new):
        method = _get(side, "method.name") or _get(default, "method.name")
        if method in METHODS:
            own = METHODS.get(method).frozen_on_resume
            keys += [k if "." in k else f"method.{method}.{k}" for k in own]
        task = _get(side, "task.name") or _get(default, "task.name")
        if task in TASKS:
            own = TASKS.get(task).frozen_on_resume
            keys += [k if "." in k else f"task.{task}.{k}" for k in own]
    return list(dict.fromkeys(keys))


def _aside_path(run_dir: Path) -> Path:
    return run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")


def leftover_asides(run_dir: Path) -> list[Path]:
    """Old runs moved aside by starts that were killed before they could restore them."""
    return sorted(run_dir.parent.glob(f".{run_dir.name}.replaced-*"))


@contextmanager
def new_run_folder(run_dir: Path, overwrite: bool, log: Log = print) -> Iterator[Path]:
    """Give the body an empty `run_dir`; on success drop the run it replaces, on failure
    (any exception, Ctrl-C included) delete what the body wrote and put the old run back."""
    for old in leftover_asides(run_dir):
        log(
            f"warning: {old} holds a run moved aside by a start that was killed; "
            f"rename it back to {run_dir} to keep it, or delete it"
        )
    aside = None
    if run_dir.is_symlink():
        raise ConfigError(
            f"run folder {run_dir} is a symlink: replayrl writes runs only into real folders "
            "(pick another logging.name or logging.run_dir)"
        )
    if run_dir.exists() and any(run_dir.iterdir()):
        if overwrite and not is_run_folder(run_dir):
            raise ConfigError(
                f"{run_dir} is not a replayrl run folder (no replayrl config.yaml in it): "
                "logging.overwrite=true only replaces runs; nothing was deleted"
            )
        if not overwrite:
            raise ConfigError(
                f"run folder {run_dir} already exists: resume it with `--resume {run_dir}`, "
                f"pick another logging.name, or set logging.overwrite=true"
            )
        aside = _aside_path(run_dir)
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(run_dir, aside)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        yield run_dir
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # a failed start must not block a rerun
        if aside is not None:
            os.replace(aside, run_dir)
            log(f"the start failed: the earlier run in {run_dir} is kept as it was")
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def is_run_folder(path: Path) -> bool:
    """A folder replayrl wrote: a real folder whose config.yaml is a replayrl config (a
    mapping with `train` and `logging` sections)."""
    cfg = path / "config.yaml"
    if not path.is_dir() or path.is_symlink() or not cfg.is_file():
        return False
    try:
        if cfg.stat().st_size > 1_000_000:
            return False
        data = yaml.safe_load(cfg.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "train" in data and "logging" in data


def check_layout(run_dir: Path) -> None:
    """Refuse a run folder whose `checkpoints/` is a symlink: writing and pruning there
    would act on whatever it points to (another run's checkpoints)."""
    ck = run_dir / "checkpoints"
    if ck.is_symlink():
        raise ConfigError(
            f"{ck} is a symlink (to {os.readlink(ck)}): checkpoints are written and pruned "
            "only inside the run folder; replace it with a real folder"
        )


def lock_path(run_dir: Path) -> Path:
    return run_dir.with_name(f".{run_dir.name}.lock")


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


@contextmanager
def run_lock(run_dir: Path) -> Iterator[Path]:
    """Hold the run folder's lock for the body; RunFailed at once if a live process holds it.

    The lock file sits beside the folder (so it also covers a start that moves the folder
    aside) and holds the owner's pid for the message. It is unlinked before it is released;
    a process that opened the old file in between sees that its inode is gone and retries.
    """
    path = lock_path(run_dir.resolve())  # the same lock however the folder is named
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunFailed(
                f"run folder {run_dir} is in use by {_holder(path)} (lock {path}): one "
                "process per run folder; wait for it to finish or stop it, or pick another "
                "logging.name"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file its last owner had just removed: take the new one
    else:
        raise RunFailed(f"could not lock run folder {run_dir} ({path} keeps changing)")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def in_current_layout(record: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with its method and task sections in today's layout (`remix.*`,
    `groups.*` and `buffer.kind` of an older release under `method`, a flat `task.digits`
    under `task.arithmetic`), so a resume compares like with like; as it is when a section
    does not validate."""
    try:
        with warnings.catch_warnings():  # the record is old, not the user's new config
            warnings.simplefilter("ignore", FutureWarning)
            record = place_method_keys(record)
    except ValueError:
        return record
    task = record.get("task")
    if not isinstance(task, dict):
        return record
    try:
        with warnings.catch_warnings():  # the record is old, not the user's new config
            warnings.simplefilter("ignore", FutureWarning)
            return {**record, "task": TaskConfig.model_validate(task).model_dump(mode="json")}
    except ValueError:
        return record


def _is_default(dotted: str, value: Any) -> bool:
    return _get(Config().model_dump(mode="json"), dotted) == value


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_resume_config(
    saved: Config, new: Config, run_dir: Path | None = None, log: Log | None = None
) -> None:
    """ConfigError naming each key fixed by the checkpoint that `new` changes, compared with
    the checkpoint's own record (its manifest) when it has one, not with config.yaml (which
    anyone can edit); any other change is accepted and logged."""
    record = None
    if run_dir is not None:
        ckpt, _ = find_checkpoints(run_dir)
        record = manifest_config(ckpt) if ckpt is not None else None
    a = in_current_layout(record if record is not None else saved.model_dump(mode="json"))
    b = new.model_dump(mode="json")
    bad = [
        f"{k} (the checkpoint has {_get(a, k)!r}, now {_get(b, k)!r})"
        for k in frozen_on_resume(a, b)
        # a key the checkpoint's record predates (added since) is compared with its default
        if _get(a, k) != _get(b, k) and not (_get(a, k) is None and _is_default(k, _get(b, k)))
    ]
    if bad:
        raise ConfigError(
            "resume: these settings are fixed by the run's checkpoints and cannot change: "
            + "; ".join(bad)
            + " (nothing was written; start a new run to change them)"
        )
    if log is None or record is None:
        return
    fa, fb = _flat(a), _flat(b)
    changed = [
        f"{k}: {fa.get(k)!r} -> {fb.get(k)!r}"
        for k in sorted(set(fa) | set(fb))
        if fa.get(k) != fb.get(k) and not k.startswith(("logging.run_dir", "logging.name"))
    ]
    if changed:
        log("resume: settings changed since the checkpoint (accepted): " + "; ".join(changed))


def write_config(run_dir: Path, cfg: Config) -> None:
    atomic_write_text(run_dir / "config.yaml", config_to_yaml(cfg))


def last_good_checkpoint(run_dir: Path | None) -> str:
    """A sentence naming the newest complete checkpoint under `run_dir` (for error text)."""
    if run_dir is None or not run_dir.is_dir():
        return "no checkpoint was written"
    path, _ = find_checkpoints(run_dir)
    if path is None:
        return f"no complete checkpoint under {run_dir}"
    return f"last good checkpoint: {path} (continue with `replayrl train --resume {run_dir}`)"


@contextmanager
def run_guard(run_dir: Path, log: Log = print) -> Iterator[None]:
    """Around a started run (after `new_run_folder` / a resumed trainer's restore): an
    expected failure (a write error such as a full disk or a
    file-size limit, a RunFailed such as exhausted worker restarts) becomes a RunFailed
    whose message names the last good checkpoint; Ctrl-C logs it too."""
    try:
        yield
    except KeyboardInterrupt:
        log(last_good_checkpoint(run_dir))
        raise
    except (OSError, RunFailed) as exc:
        if isinstance(exc, CheckpointWriteError):  # its message names the last good one
            raise RunFailed(str(exc)) from exc
        if isinstance(exc, RunFailed):  # keep its type (RewardFunctionFailed, ...)
            exc.args = (f"{exc}; {last_good_checkpoint(run_dir)}",)
            raise
        raise RunFailed(f"{type(exc).__name__}: {exc}; {last_good_checkpoint(run_dir)}") from exc


# -- code and paths a resumed run would use ----------------------------------------------------

ORIGIN = "origin.json"  # where the run was started and the reward files' SHA-256


def _file_target(spec: str) -> str | None:
    """The file of a `path/to/file.py:fn` reward spec (None for built-ins and modules)."""
    target, sep, _ = spec.rpartition(":")
    if not sep or not target:
        return None
    return target if target.endswith(".py") or "/" in target or "\\\\" in target else None


_SHIPPED = Path(__file__).resolve().parents[2]  # the replayrl package (preset reward files)


def code_specs(cfg: Config) -> list[str]:
    """Reward entries that name code (a file or `module:fn`) other than replayrl's own
    (built-in names, reward files shipped with the presets, `replayrl.*` modules)."""
    out = []
    for r in cfg.rewards:
        if ":" not in r.name or r.name.startswith("replayrl."):
            continue
        target = _file_target(r.name)
        if target and Path(target).expanduser().resolve().is_relative_to(_SHIPPED):
            continue
        out.append(r.name)
    return out


def _anchor(cfg: Config, base: Path, rewards: bool, data: bool) -> None:
    """Make relative reward files and data paths absolute against `base` (in place)."""
    if rewards:
        for r in cfg.rewards:
            target = _file_target(r.name)
            if target and not Path(target).expanduser().is_absolute():
                fn = r.name.rpartition(":")[2]
                r.name = f"{(base / target).resolve()}:{fn}"
    if data:
        t = cfg.task.settings  # a task that reads files names them in its own section
        for key in ("path", "eval_path"):
            value = getattr(t, key, None)
            if isinstance(value, str) and value and "://" not in value:
                if not Path(value).expanduser().is_absolute() and (base / value).exists():
                    setattr(t, key, str((base / value).resolve()))


def _hashes(cfg: Config) -> dict[str, str]:
    out = {}
    for r in cfg.rewards:
        target = _file_target(r.name)
        if target and Path(target).is_file():
            out[target] = hashlib.sha256(Path(target).read_bytes()).hexdigest()
    return out


def record_origin(run_dir: Path, cfg: Config) -> None:
    """At a start: the folder it was started from and each reward file's SHA-256."""
    anchored = cfg.model_copy(deep=True)
    _anchor(anchored, Path.cwd(), rewards=True, data=False)  # keys: absolute paths
    origin = {"cwd": os.getcwd(), "reward_files": _hashes(anchored)}
    atomic_write_text(run_dir / ORIGIN, json.dumps(origin, indent=1))


def _read_origin(run_dir: Path) -> dict[str, Any]:
    path = run_dir / ORIGIN
    try:
        if path.stat().st_size > 1_000_000:
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _start_folder(origin: dict[str, Any]) -> str | None:
    cwd = origin.get("cwd")
    return cwd if isinstance(cwd, str) else None


def check_resume_code(
    run_dir: Path,
    cfg: Config,
    overrides: list[str],
    trust: bool | None,
    own_rewards: bool,
    log: Log = print,
) -> list[str]:
    """Resume runs no code named by a run folder without consent (in place on `cfg`).

    Relative paths resolve against the folder the run was started from (recorded in
    origin.json), not the current one. Reward files or `module:fn` entries that come from
    the run folder's config run when the folder's signed record verifies with this user's
    key (`run.trust`: a folder this user started, or trusted with `replayrl trust`), with
    `trust` True (`--trust-run-code`), or when the rewards are given again (`rewards=...`
    override, or reward objects from the Python API). `trust` None (a Python caller that did
    not decide) is consent too, but not to a reward file changed since the start.
    Returns the run folder's code entries that the resume will run (none when given again).
    """
    given = own_rewards or any(o.split("=", 1)[0].strip().startswith("rewards") for o in overrides)
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    # a task's files: task.dataset.path (task.path in the old flat layout), any task's section
    data_given = any(
        k.startswith("task.") and k.rpartition(".")[2] in ("path", "eval_path") for k in keys
    )
    origin = _read_origin(run_dir)
    cwd = _start_folder(origin)
    base = Path(cwd) if cwd is not None else None
    if given:
        _anchor(cfg, Path.cwd(), rewards=True, data=False)  # typed now: relative to here
    elif base is not None:
        _anchor(cfg, base, rewards=True, data=False)
    if base is not None and not data_given:
        _anchor(cfg, base, rewards=False, data=True)
    if given or own_rewards:
        return []
    specs = code_specs(cfg)
    if not specs:
        return []
    if trust is not True:
        verdict = verify_run_folder(run_dir, cwd, reward_refs(specs, _file_target))
        if verdict.trusted:
            log(f"resume: {run_dir} is signed with your key; running its reward code as signed")
            return specs
        if trust is False:
            raise ConfigError(_refusal(run_dir, specs, verdict))
    _check_unchanged(origin, specs, accept=trust is True, log=log)
    if trust is None:
        log(f"warning: resuming runs reward code named by {run_dir}: {', '.join(specs)}")
    return specs


def _refusal(run_dir: Path, specs: list[str], verdict: Verdict) -> str:
    if verdict.changed_file is not None:
        return (
            f"{verdict.reason}: resuming would score with other code; pass --trust-run-code "
            "to resume with it as it is now, or give rewards=[...] again"
        )
    return (
        f"{run_dir}/config.yaml names reward code ({', '.join(specs)}): a resume runs no "
        f"code from a run folder without consent, and this folder is not trusted: "
        f"{verdict.reason}; pass --trust-run-code if you trust it (or `replayrl trust "
        f"{run_dir}` once), or give the rewards again (rewards=[...])"
    )


def _check_unchanged(origin: dict[str, Any], specs: list[str], accept: bool, log: Log) -> None:
    """Reward files whose contents differ from those at the start (origin.json): refused,
    or with `accept` (an explicit --trust-run-code) run as they are now, with a warning."""
    recorded = origin.get("reward_files") or {}
    now = {r["file"]: r["sha256"] for r in reward_refs(specs, _file_target) if r["file"]}
    for spec in specs:
        target = _file_target(spec)
        if target is None:
            continue
        old = recorded.get(target)
        if old is None or now.get(target) == old:
            continue
        if not accept:
            raise ConfigError(
                f"reward file {target} changed since the run started (SHA-256 differs): "
                "resuming would score with other code; pass --trust-run-code, or give "
                "rewards=[...] again, to use it as it is now"
            )
        log(f"warning: reward file {target} changed since the run started; running it as it is now")


def run_code(run_dir: Path) -> tuple[Config, str | None, list[dict[str, Any]]]:
    """A run folder's config (reward files resolved against its start folder), the start
    folder, and the code references a resume of it would run (`run.trust.reward_refs`)."""
    cfg = load_config(run_dir / "config.yaml")
    cwd = _start_folder(_read_origin(run_dir))
    if cwd is not None:
        _anchor(cfg, Path(cwd), rewards=True, data=False)
    return cfg, cwd, reward_refs(code_specs(cfg), _file_target)


def sign_run(run_dir: Path, cfg: Config, log: Log = print) -> None:
    """Sign what the run in `run_dir` executes (after config.yaml and origin.json are written);
    a resume of this user's own folder then needs no --trust-run-code."""
    cwd = _start_folder(_read_origin(run_dir))
    anchored = cfg.model_copy(deep=True)
    if cwd is not None:
        _anchor(anchored, Path(cwd), rewards=True, data=False)
    refs = reward_refs(code_specs(anchored), _file_target)
    sign_or_warn(run_dir, cfg.model_dump(mode="json"), cwd, refs, log)
