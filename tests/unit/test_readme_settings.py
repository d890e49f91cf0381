"""The README's configuration table names exactly the settings the config model has; its examples load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from runner_pool.domain.config import ConfigError, StackConfig, load_config

README = Path(__file__).resolve().parents[2] / "README.md"


def _model_settings(model: type[BaseModel], prefix: str = "") -> set[str]:
    settings: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            settings |= _model_settings(annotation, f"{prefix}{name}.")
        else:
            settings.add(prefix + name)
    return settings


def _readme_settings() -> set[str]:
    table = README.read_text().split("<!-- settings:start -->")[1].split("<!-- settings:end -->")[0]
    return set(re.findall(r"^\| `([a-z_.]+)` \|", table, flags=re.MULTILINE))


def test_readme_documents_every_setting_and_no_other() -> None:
    # Given the config model and the README / Then each names exactly the settings of the other
    assert _readme_settings() == _model_settings(StackConfig)


def test_readme_defaults_match_the_model() -> None:
    # Given a README row with a plain number as its default / Then the model has that default
    config = StackConfig()
    table = README.read_text().split("<!-- settings:start -->")[1].split("<!-- settings:end -->")[0]
    for setting, default in re.findall(r"^\| `([a-z_.]+)` \| (\d+) \|", table, flags=re.MULTILINE):
        value: object = config
        for part in setting.split("."):
            value = getattr(value, part)
        assert value == int(default), setting


def test_the_readme_schedule_example_loads_and_its_refusal_is_synths() -> None:
    # Given the README's example of warm minimums on a schedule
    section = README.read_text().split("### Warm minimums on a schedule")[1]
    example = json.loads("{" + section.split("```json")[1].split("```")[0] + "}")
    # When it is loaded / Then it is accepted, with its windows
    config = load_config(example)
    assert len(config.warm_pool_minimum["xlarge"].windows) == 2
    # And the overlap the README quotes is what synth says of it, word for word
    quoted = re.search(r"e\.g\. `(warm_pool_minimum\.xlarge\.windows\.1:[^`]+)`", section)
    assert quoted is not None
    windows = example["warm_pool_minimum"]["xlarge"]["windows"]
    windows[1] = {"days": ["fri"], "start": "17:00", "end": "20:00", "hot": 2}
    with pytest.raises(ConfigError) as refused:
        load_config(example)
    assert refused.value.problems[0].startswith(" ".join(quoted[1].split()))
