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
