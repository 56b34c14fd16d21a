"""Lock names from templates, and from a call's arguments bound to a signature."""

from __future__ import annotations

import inspect

import pytest

from django_distlock.engine.templates import NameTemplate, TemplateError


def report(day, kind="daily", *, region="eu"): ...


SIGNATURE = inspect.signature(report)


def test_positional_keyword_and_default_arguments_name_the_same_lock():
    name_for = NameTemplate("report:{day}:{kind}:{region}").namer(SIGNATURE, "report()")
    assert name_for(("mon",), {}) == "report:mon:daily:eu"
    assert name_for((), {"day": "mon"}) == "report:mon:daily:eu"
    assert name_for(("mon", "daily"), {"region": "eu"}) == "report:mon:daily:eu"


def test_a_field_that_is_no_parameter_fails_at_once_naming_where():
    with pytest.raises(ValueError, match=r"uses \{dya\} but report\(\) has no parameter 'dya'"):
        NameTemplate("report:{dya}").namer(SIGNATURE, "report()")


def test_attribute_and_index_fields_start_from_a_parameter():
    name_for = NameTemplate("r:{day.upper}:{kind[0]}").namer(SIGNATURE, "report()")
    assert name_for(("mon",), {}).startswith("r:<built-in method upper")
    with pytest.raises(TemplateError, match=r"\{kind\[0\]\}"):
        name_for(("mon", ""), {})


def test_a_call_that_does_not_bind_is_a_type_error():
    name_for = NameTemplate("report:{day}").namer(SIGNATURE, "report()")
    with pytest.raises(TypeError):
        name_for((), {})


def test_a_constant_template_needs_no_arguments():
    name_for = NameTemplate("nightly").namer(SIGNATURE, "report()")
    assert name_for((), {}) == "nightly"


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("r:{day!z}", r"\{day!z\}: a conversion is !r, !s or !a"),
        ("r:{day:>{kind!x}}", r"\{kind!x\}: a conversion"),
        ("r:{day:{kind:{region}}}", r"\{region\} is nested too deep"),
        ("r:{day", "expected '}'"),
    ],
)
def test_what_str_format_would_refuse_whatever_the_values_is_refused_at_once(template, why):
    with pytest.raises(ValueError, match=why):
        NameTemplate(template)


def test_fields_nested_in_a_format_spec_are_fields_too():
    template = NameTemplate("r:{day!r:>{kind}}")
    assert template.fields == ("day", "kind")
    with pytest.raises(ValueError, match=r"uses \{width\} but report\(\) has no parameter"):
        NameTemplate("r:{day:>{width}}").namer(SIGNATURE, "report()")
    assert template.namer(SIGNATURE, "report()")(("mon", 6), {}) == "r: 'mon'"
