"""The base of every config section: strict keys, no NaN, no boolean where a number goes.

A reuse method or task declares its own section by subclassing `Section` next to its code
(`methods/ar3po.py`'s `Ar3poConfig`); the schema validates it under the method's name.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits a bool (bool itself, Any, or a union/Literal with one)."""
    if annotation is bool or annotation is Any:
        return True
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in args)
    return any(_takes_bool(a) for a in args)


def _wants_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(_wants_number(a) for a in get_args(annotation))


class Section(BaseModel):
    # numbers accepted where text is expected: `logging.name=2024` is a name, not an error;
    # NaN and inf are never a meaningful setting (allow_inf_nan=False)
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        coerce_numbers_to_str=True,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1 for an int field: `train.steps=true` would train 1 step
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            if _wants_number(annotation) and not _takes_bool(annotation):
                raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
        return value


def nested_errors(prefix: str, exc: ValidationError) -> str:
    """A section's validation errors, each under its full dotted key (`prefix.key: msg`)."""
    return "; ".join(
        f"{prefix}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
    )
