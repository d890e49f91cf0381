"""Each ASL definition is parsed once per process (emulator/asl_parse_cache.py), and what moto gets
from the parse is what it got before: fresh components for every execution, errors for a bad one."""

from __future__ import annotations

import json

import pytest
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

from emulator import step_functions  # noqa: F401 - installs the cache, as every user of the harness does


def _definition(result: str) -> str:
    return json.dumps(
        {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "Result": result, "End": True}}}
    )


def test_a_definition_is_parsed_once_and_each_caller_gets_its_own_components() -> None:
    # Given a definition parsed once
    definition = _definition("first")
    first_program, first_tree = AmazonStateLanguageParser.parse(definition)
    # When it is parsed again (the next execution)
    second_program, second_tree = AmazonStateLanguageParser.parse(definition)
    # Then the parse tree is the one kept, and the evaluation components are new
    assert second_tree is first_tree
    assert second_program is not first_program
    assert type(second_program) is type(first_program)


def test_a_different_definition_is_parsed_on_its_own() -> None:
    _, one = AmazonStateLanguageParser.parse(_definition("one"))
    _, other = AmazonStateLanguageParser.parse(_definition("other"))
    assert one is not other


def test_a_bad_definition_fails_every_time_with_motos_own_error() -> None:
    # Given a definition that does not parse
    bad = '{"StartAt": "Nowhere", "States": {"Nowhere": {"Type": "NoSuchType"}}}'
    # Then each parse fails, none is kept
    for _ in range(2):
        with pytest.raises(Exception) as raised:  # noqa: PT011 - moto's own type, checked by name
            AmazonStateLanguageParser.parse(bad)
        assert type(raised.value).__name__ == "ASLParserException"
