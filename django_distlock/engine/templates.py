"""Lock names made from templates: ``"report:{day}"`` filled from a call's arguments,
``"invoice:{invoice_id}"`` from a URL, ``"import:{source}"`` from a command's options.

One parser and one filler for every caller, so that a template means the same thing
and fails the same way everywhere: ``str.format`` fields (``{user.pk}``,
``{items[0]}``), checked against what will fill them as early as the caller can, and
filled into a name that is validated like any other.

>>> template = NameTemplate("report:{day}")
>>> template.fields, template.roots
(('day',), ('day',))
>>> template.fill({"day": "2026-11-23"})
'report:2026-11-23'
>>> NameTemplate("report:{day}").fill({})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
django_distlock.engine.templates.TemplateError: cannot fill {day} in lock name ...
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .keys import validate_name

__all__ = ["NameTemplate", "TemplateError"]

_FORMATTER = string.Formatter()
_CONVERSIONS = (None, "r", "s", "a")
_FILL_ERRORS = (LookupError, AttributeError, TypeError, ValueError)


class TemplateError(ValueError):
    """A template cannot be filled from the values it was given (a field is missing,
    an attribute or an index fails). The message names the field."""


class NameTemplate:
    """A lock-name template; ``ValueError`` if it is not a valid ``str.format`` string."""

    __slots__ = ("fields", "roots", "template")

    def __init__(self, template: str) -> None:
        if not isinstance(template, str):
            raise TypeError(f"a lock name template must be a str, not {type(template).__name__}")
        try:
            fields = _fields(template)
        except ValueError as exc:
            raise ValueError(f"lock name {template!r} is not a valid template: {exc}") from None
        self.template = template
        self.fields: tuple[str, ...] = fields
        """The fields as written (``user.pk``), those nested in a format spec
        (``{amount:>{width}}``) included."""
        self.roots: tuple[str, ...] = tuple(_root(field) for field in self.fields)
        """The name each field starts from (``user``); ``""`` or digits for positional ones."""

    def __repr__(self) -> str:
        return f"NameTemplate({self.template!r})"

    @property
    def is_constant(self) -> bool:
        """True when the template has no fields: it is the name itself."""
        return not self.fields

    def unknown_fields(self, known: Iterable[str]) -> list[tuple[str, str]]:
        """``(field, root)`` of the fields whose root is not among ``known`` names
        (positional fields count as unknown): what a caller can report before any value
        exists."""
        names = set(known)
        pairs = zip(self.fields, self.roots, strict=True)
        return [(field, root) for field, root in pairs if root not in names]

    def fill(self, values: Mapping[str, Any], args: Sequence[Any] = ()) -> str:
        """The name for ``values`` (and positional ``args``), validated like any lock name
        (``ValueError`` naming "formatted lock name"); :class:`TemplateError` when a
        field cannot be filled."""
        if self.is_constant:
            return self.template
        try:
            name = _FORMATTER.vformat(self.template, args, values)
        except _FILL_ERRORS as exc:
            field = next((f for f in self.fields if not _fills(f, args, values)), None)
            where = f"{{{field}}}" if field is not None else "it"
            raise TemplateError(
                f"cannot fill {where} in lock name {self.template!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return validate_name(name, "formatted lock name")

    def namer(
        self, signature: inspect.Signature, where: str
    ) -> Callable[[Sequence[Any], Mapping[str, Any]], str]:
        """The name for a call's ``(args, kwargs)``: the arguments bound to ``signature``
        with its defaults applied, so that ``f(1)`` and ``f(x=1)`` name the same lock.

        ``ValueError`` now, naming ``where`` (``"build_report()"``), if a field names no
        parameter of ``signature``; ``TypeError`` later if a call does not bind to it.
        """
        if self.is_constant:
            return lambda args, kwargs: self.template
        for field, root in self.unknown_fields(signature.parameters):
            raise ValueError(
                f"lock name {self.template!r} uses {{{field}}} but "
                f"{where} has no parameter {root!r}"
            )

        def name_for(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return self.fill(bound.arguments)

        return name_for


def _fields(template: str, depth: int = 0) -> tuple[str, ...]:
    """The fields of ``template``; ``ValueError`` for what ``str.format`` refuses
    whatever the values: bad syntax, a conversion other than ``!r``, ``!s`` or ``!a``, a
    field nested in the format spec of a nested one."""
    fields: list[str] = []
    for _, field, spec, conversion in _FORMATTER.parse(template):
        if field is None:
            continue
        if depth > 1:
            raise ValueError(f"{{{field}}} is nested too deep (one level at most)")
        if conversion not in _CONVERSIONS:
            raise ValueError(f"{{{field}!{conversion}}}: a conversion is !r, !s or !a")
        fields.append(field)
        if spec:
            fields.extend(_fields(spec, depth + 1))
    return tuple(fields)


def _root(field: str) -> str:
    return field.split(".", 1)[0].split("[", 1)[0]


def _fills(field: str, args: Sequence[Any], values: Mapping[str, Any]) -> bool:
    try:
        _FORMATTER.get_field(field, args, values)
    except _FILL_ERRORS:
        return False
    return True
