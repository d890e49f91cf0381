"""Whether an operator opened a Session Manager session on this instance: if so, no job runs here again.

Systems Manager's agent runs each session as the local account `ssm-user`, which it creates, with sudo,
"the first time a session is started on an instance" (Systems Manager User Guide, "Turn on or turn off
ssm-user account administrative permissions"; SSM Agent 2.3.612.0 and later), and the account stays. A
session is a root shell on the instance, in the operator's hands: what it changed, installed or read, no
scrub can tell from a clean instance. So the account's existence is the trace, and the instance is
retired rather than pooled or handed another runner. The image never has the account (no session runs
while it is built: Image Builder runs its builds through Run Command), so the trace is the operator's.
"""

from __future__ import annotations

from pathlib import Path

SESSION_ACCOUNT = "ssm-user"


def session_trace(passwd_file: Path, account: str = SESSION_ACCOUNT) -> str | None:
    """Why the instance must not serve again because a session ran on it; None when none did. An
    unreadable account database is a reason too: the check fails closed."""
    try:
        lines = passwd_file.read_text().splitlines()
    except OSError as exc:
        return f"the accounts ({passwd_file}) could not be read to look for an operator's session: {exc}"
    if any(line.split(":", 1)[0] == account for line in lines):
        return (
            f"an operator's Session Manager session ran here (the account {account} exists), so the "
            "instance is not reused"
        )
    return None
