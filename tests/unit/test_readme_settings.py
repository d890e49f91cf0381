"""The README's configuration table names exactly the settings the config model has."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from runner_pool.domain.config import StackConfig

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
    table = README.read_text().split("<!-- settings:start -->")[1]
    for setting, default in re.findall(r"^\| `([a-z_.]+)` \| (\d+) \|", table, flags=re.MULTILINE):
        value: object = config
        for part in setting.split("."):
            value = getattr(value, part)
        assert value == int(default), setting
