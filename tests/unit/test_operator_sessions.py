"""An operator's Session Manager session retires its instance: the `ssm-user` account is the trace, and an
account database that cannot be read counts as a session (the check fails closed)."""

from __future__ import annotations

from pathlib import Path

from agent.operator_sessions import SESSION_ACCOUNT, session_trace


def test_an_instance_no_session_ran_on_has_no_trace(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\nrunner:x:1001:1001::/home/runner:/bin/bash\n")
    assert session_trace(passwd) is None


def test_the_session_account_is_a_trace_and_a_lookalike_is_not(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(
        f"root:x:0:0:root:/root:/bin/bash\n{SESSION_ACCOUNT}:x:1002:1002::/home/ssm-user:/bin/sh\n"
    )
    assert SESSION_ACCOUNT in (session_trace(passwd) or "")
    passwd.write_text(f"{SESSION_ACCOUNT}-old:x:1003:1003::/home/x:/bin/sh\n")
    assert session_trace(passwd) is None


def test_an_account_database_that_cannot_be_read_fails_closed(tmp_path: Path) -> None:
    # Given no account database where the agent looks / Then the instance is refused, with why
    trace = session_trace(tmp_path / "missing")
    assert trace is not None
    assert "could not be read" in trace
