"""The synthesized template's cache (emulator/template.py): one assembly per checkout and content."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator import template


def _checkout(root: Path) -> Path:
    root.mkdir()
    (root / "app.py").write_text("app")
    (root / "cdk.json").write_text("{}")
    for folder in ("infra", "lambdas/runner_pool", "agent"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "module.py").write_text(folder)
    return root


def test_two_checkouts_with_the_same_content_get_assemblies_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two checkouts with the very same content (the assembly's assets are their absolute paths)
    first, second = _checkout(tmp_path / "first"), _checkout(tmp_path / "second")
    # When each computes its template key
    monkeypatch.setattr(template, "PROJECT_ROOT", first)
    first_key = template.template_key()
    monkeypatch.setattr(template, "PROJECT_ROOT", second)
    second_key = template.template_key()
    # Then the keys differ: deleting one checkout never breaks the other's cached assembly
    assert first_key != second_key
    # ... while the same checkout keeps its key as long as its content does not change
    assert template.template_key() == second_key


def test_what_synthesis_builds_under_its_inputs_leaves_the_key_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a checkout and its key before any synthesis
    root = _checkout(tmp_path / "checkout")
    monkeypatch.setattr(template, "PROJECT_ROOT", root)
    before = template.template_key()
    # When a synthesis builds the agent's wheelhouse under infra/ (another test worker may be writing it
    # while this one hashes: a `.partial` file there vanished mid-read on a fresh clone's make test)
    wheels = root / "infra" / "instances" / "build" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / ".cryptography.whl.partial").write_bytes(b"half a wheel")
    # Then the key is the one from before: the assembly made before the wheelhouse is found after it
    assert template.template_key() == before
    # ... while a real input under infra/ still changes it
    (root / "infra" / "instances" / "user_data.sh").write_text("#!/bin/sh")
    assert template.template_key() != before
