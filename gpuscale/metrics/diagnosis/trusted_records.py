"""Pydantic records built from values this code computed itself, without validating them again.

The diagnosis builds a GpuSignals per GPU and a verdict per GPU or pod on every `gpuscale top` frame; this is
the constructor those hot paths use (``trusted``), kept apart from the models so any module can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

_M = TypeVar("_M", bound=BaseModel)


def trusted(model: type[_M]) -> Callable[[dict[str, Any]], _M]:
    """A constructor of ``model`` from values this code computed itself, already of each field's own type
    (float, int, str, an enum member, a model instance, a list or dict of those): what ``model.model_validate``
    would return, fields set and all, without validating again.

    NB: the records of one `gpuscale top` frame (a GpuSignals per GPU, a verdict per GPU or pod, its findings,
    a PodStatus per pod: ~25,000 at 10,000 GPUs) cost 3–6 µs each to validate and ~1.5 µs this way. It is
    ``model_construct`` (pydantic's own path for trusted data: no validation) with the defaults worked out once
    per model instead of per record. Only for models without validators or private attributes; tests compare
    it with ``model_validate`` (tests/metrics/test_trusted.py).
    """
    if model.__pydantic_decorators__.model_validators or model.__pydantic_decorators__.field_validators:
        raise TypeError(f"{model.__name__} has validators: construct it with model_validate")
    if model.__private_attributes__:
        raise TypeError(f"{model.__name__} has private attributes: construct it with model_validate")
    template: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in model.model_fields.items():
        template[name] = None if info.is_required() or info.default_factory is not None else info.default
        if info.default_factory is not None:
            factories.append((name, info.default_factory))  # type: ignore[arg-type]
    new, assign = object.__new__, object.__setattr__

    def construct(values: dict[str, Any]) -> _M:
        fields = template.copy()  # NB: every field, in declaration order, as validation leaves __dict__
        fields.update(values)
        for name, factory in factories:
            if name not in values:
                fields[name] = factory()
        record = new(model)
        assign(record, "__dict__", fields)
        assign(record, "__pydantic_fields_set__", set(values))
        assign(record, "__pydantic_extra__", None)
        assign(record, "__pydantic_private__", None)
        return record

    return construct
