"""Every config key with a one-line description: `replayrl config show --doc` and
`replayrl config explain KEY`.

A field's description is its `Field(description=...)` in config/schema.py when it has one,
else the comment written beside it (or just above it) in that file, so every key that is
commented there is documented without repeating the text.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import tokenize
from typing import Any

from pydantic import BaseModel

from replayrl.config import schema
from replayrl.config.schema import Config, section_fields


def _comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment beside the field, or the block just above it,
    in config/schema.py and in the modules of the registered methods', tasks', backends' and
    runtimes' own sections."""
    modules = {schema} | {
        inspect.getmodule(sub)
        for owner in (schema.MethodConfig, schema.TaskConfig, Config)
        for sub in section_fields(owner).values()
        if isinstance(sub, type) and issubclass(sub, BaseModel)
    }
    out: dict[tuple[str, str], str] = {}
    for module in modules:
        if module is not None:
            out |= _module_comments(inspect.getsource(module))
    return out


def _module_comments(source: str) -> dict[tuple[str, str], str]:
    by_line: dict[int, str] = {}  # trailing comments
    alone: dict[int, str] = {}  # comment-only lines
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            (alone if tok.line.strip().startswith("#") else by_line)[tok.start[0]] = text
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            line = item.lineno - 1
            while line in alone:  # a comment block right above the field
                above.insert(0, alone[line])
                line -= 1
            beside = by_line.get(item.lineno)
            text = " ".join([*above, *([beside] if beside else [])])
            if text:
                out[(node.name, item.target.id)] = text
    return out


def key_docs(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, str]:
    """Dotted key -> description ('' when the schema says nothing about it)."""
    comments = _comments()
    out: dict[str, str] = {}

    def walk(m: type[BaseModel], pre: str) -> None:
        for name, sub in section_fields(m).items():
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                walk(sub, f"{pre}{name}.")
                continue
            f = m.model_fields[name]
            out[f"{pre}{name}"] = f.description or comments.get((m.__name__, name), "")

    walk(model, prefix)
    return out


ABSENT = object()  # a key of a section this config does not hold (another task's)


def _value(cfg: Config, key: str) -> Any:
    """The key's value as plain data (what config.yaml holds), or ABSENT."""
    node: Any = cfg.model_dump(mode="json")
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def default_value(key: str) -> Any:
    """The schema's default of `key` as plain data (also for a section that only the
    selected task holds)."""
    value = _value(Config(), key)
    if value is ABSENT:
        value = _field(key).get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _shown(value: Any) -> str:
    """A value as a config file or an override writes it (null, true, "text"), not a repr."""
    return json.dumps(value)


def show_doc(cfg: Config) -> str:
    """`key = value  # description`, one line per key of the resolved config."""
    lines = []
    for key, doc in key_docs().items():
        value = _value(cfg, key)
        if value is not ABSENT:  # another task's settings: not this run's
            lines.append(f"{key} = {_shown(value)}" + (f"  # {doc}" if doc else ""))
    return "\n".join(lines) + "\n"


def explain(cfg: Config, key: str) -> str:
    """A key's description, type, default and value here (keys under a section: all of them)."""
    from replayrl.api.trl_args import suggest

    docs = key_docs()
    keys = [k for k in docs if k == key or k.startswith(key + ".")]
    if not keys:
        raise KeyError(f"unknown config key {key!r}{suggest(key, docs)}")
    out = []
    for k in keys:
        field_type = _field(k).annotation
        shown = getattr(field_type, "__name__", None) or str(field_type).replace("typing.", "")
        here = _value(cfg, k)
        out.append(
            f"{k}: {docs[k] or '(no description)'}\n    type {shown}; default "
            f"{default_value(k)!r}; here "
            + (f"{here!r}" if here is not ABSENT else f"unused (task.name={cfg.task.name})")
        )
    return "\n".join(out) + "\n"


def _field(key: str) -> Any:
    model: Any = Config
    parts = key.split(".")
    for part in parts[:-1]:
        model = section_fields(model)[part]
    return model.model_fields[parts[-1]]
