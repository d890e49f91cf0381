"""The runner's JIT config as files the runner reads: GitHub's settings, with self-update turned off.

What the runner does with a JIT config, read in actions/runner at commit 258d6c857db3 (runner 2.336.0);
paths are under src/, a file's directory given where it is first named:

- `run.sh [args]` runs `bin/Runner.Listener run [args]` (Misc/layoutroot/run.sh:17-18,
  Misc/layoutroot/run-helper.sh.template:36). `--jitconfig` is an argument of `run`
  (Runner.Listener/CommandSettings.cs:64-70), taken from argv or else from the variable
  `ACTIONS_RUNNER_INPUT_JITCONFIG` (CommandSettings.cs:110-140, 222-226, 365-374, 429-439).
- Given one, the listener base64-decodes it into a map of file name to base64 content, writes each file
  into its root directory with `File.WriteAllBytes`, and does nothing else with it (the hidden attribute;
  on Windows, DPAPI on the RSA key; its user agents reloaded from the files):
  Runner.Listener/Runner.cs:234-268. Then, given one or not, it loads `.runner` (Runner.cs:270,
  Runner.Common/ConfigurationStore.cs:280-297) and runs from it. No setting comes from the argument.
- Ephemeral is `.runner`'s `Ephemeral` (ConfigurationStore.cs:38-39): it makes the listener take one
  job and exit (Runner.cs:331, `command.RunOnce || settings.Ephemeral`), exit when its job is gone
  (Runner.cs:699-704) and delete its settings files after the job (Runner.cs:877-880,
  Runner.Listener/Configuration/ConfigurationManager.cs:496-525). `--ephemeral` is a flag of
  `configure` only (CommandSettings.cs:32-54), which writes it into `.runner` (ConfigurationManager.cs:258).
- Self-update: `.runner`'s `DisableUpdate` (ConfigurationStore.cs:35-36) goes with every message poll
  (Runner.Listener/MessageListener.cs:251-259 and 277-283, Runner.Listener/BrokerMessageListener.cs:
  296-302): that is how GitHub learns not to send the runner an update, which the listener would apply
  (Runner.cs:608-658). `--disableupdate` is a flag of `configure` only (CommandSettings.cs:35), which
  writes it into `.runner` and the registration (ConfigurationManager.cs:257, 341, 676-688). A JIT
  runner is not configured by config.sh, and GitHub's generate-jitconfig takes no such option
  (terraform-aws-github-runner#3392: "For JIT config you cannot pass this option"; #4052: such runners
  updated themselves after launch). So `--jitconfig` alone leaves updates on: the agent sets
  `DisableUpdate` in `.runner`.
- Labels are no local setting: `.runner` has none (ConfigurationStore.cs:14-161); they are the
  registration's (`configure` sends them: ConfigurationManager.cs:263, 341), for a JIT runner the ones
  generate-jitconfig was given. The work folder is `.runner`'s `WorkFolder`, under the root directory
  (Runner.Common/HostContext.cs:427-434).
- `.runner` is read with Newtonsoft.Json and camelCase names (Runner.Sdk/Util/StringUtil.cs:12-18 and
  35-38, Sdk/WebApi/WebApi/VssJsonMediaTypeFormatter.cs:101-110), which matches names ignoring case
  (Microsoft Learn, *Migrate from Newtonsoft.Json to System.Text.Json*, "Case-insensitive
  deserialization"); `disableUpdate` is written as the runner itself writes it.

So the agent writes the config's files itself (agent/runner_install.py) and starts `run.sh` with no
argument (agent/runner.py): the runner loads the very settings `--jitconfig` would have written, updates
off. What differs is on purpose. The files are the runner account's alone, mode 0600 as the runner makes
its own key file (Runner.Listener/Configuration/RSAFileKeyManager.cs:29-46), where `WriteAllBytes` leaves
them to the umask. A name that is not one of the runner's own files is refused, where the listener would
write `Path.Combine(root, name)` wherever that points (Runner.cs:243). And the config is never in argv,
which every user can read (`/proc/<pid>/cmdline`) and which run.sh and run-helper.sh pass on. The
variable would keep it out of argv, and the listener masks it in its log and drops it from its own
environment (CommandSettings.cs:125-138, Runner.Common/Constants.cs:108-119), but run.sh and
run-helper.sh, above it, would hold it in theirs for the runner's life.
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
