"""The runner's JIT config with self-update turned off: an instance runs the runner release it was built with.

A JIT runner is not configured by config.sh, so `config.sh --disableupdate` is not there to use, and
GitHub's generate-jitconfig API takes no such option (terraform-aws-github-runner#3392: "For JIT
config you cannot pass this option"; #4052: such runners updated themselves after launch). What the
runner does with the config is in actions/runner (v2.328.0): `run.sh --jitconfig` decodes it, a base64
JSON object mapping each of the runner's settings files (`.runner`, `.credentials`, ...) to its base64
content, writes the files into the runner directory, then loads `.runner`
(src/Runner.Listener/Runner.cs, lines 234-270). `.runner` holds RunnerSettings, whose `DisableUpdate`
(src/Runner.Common/ConfigurationStore.cs) is the setting `--disableupdate` writes; the listener sends
it with every message poll (src/Runner.Listener/MessageListener.cs and BrokerMessageListener.cs,
`disableUpdate`), which is how GitHub learns not to send the runner an update. So the agent sets it in
`.runner` before the runner starts. The runner reads the file with Newtonsoft.Json, whose property
names match case-insensitively; it writes them in camelCase (`disableUpdate`), and so does this.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from agent.runner import RunnerStartError

SETTINGS_FILE = ".runner"
DISABLE_UPDATE = "disableUpdate"


class JitConfigError(RunnerStartError):
    """The config is not a JIT runner config the runner could load: the runner is not started, and the
    message is the reason given in UD_REG_FAILED."""


def without_self_update(encoded: str) -> str:
    """`encoded` (a JIT config, as GitHub returns it) with `.runner`'s DisableUpdate set, all else kept."""
    files = _decode_json(encoded, "the JIT config")
    if not isinstance(files, dict) or SETTINGS_FILE not in files:
        raise JitConfigError(f"the JIT config has no {SETTINGS_FILE} file")
    settings = _decode_json(files[SETTINGS_FILE], f"the JIT config's {SETTINGS_FILE}")
    if not isinstance(settings, dict):
        raise JitConfigError(f"the JIT config's {SETTINGS_FILE} is not a JSON object")
    # Whatever casing GitHub used for the key, one entry remains, so the runner cannot read a stale one.
    settings = {key: value for key, value in settings.items() if key.lower() != DISABLE_UPDATE.lower()}
    settings[DISABLE_UPDATE] = True
    files[SETTINGS_FILE] = _encode_json(settings)
    return _encode_json(files)


def runner_files(encoded: str) -> dict[str, bytes]:
    """The settings files `encoded` holds, self-update off, as the runner would write them (name: content).
    The agent writes them itself (agent/runner_install.py), so the config is never a runner argument."""
    files = _decode_json(without_self_update(encoded), "the JIT config")
    return {name: base64.b64decode(content) for name, content in files.items()}


def _decode_json(encoded: Any, what: str) -> Any:
    if not isinstance(encoded, str):
        raise JitConfigError(f"{what} is not base64 text")
    try:
        return json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise JitConfigError(f"{what} is not base64-encoded JSON: {exc}") from None


def _encode_json(value: Any) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()
