"""The user data's install path, run for real on the distributions we claim, in a throwaway root.

The script is the one the synthesised launch template carries (intrinsic functions resolved to test
values), run by bash with RUNNER_POOL_BOOT_ROOT pointing every path it writes at a temporary
directory, and inside a network namespace of its own (`unshare --net`): anything it tried to fetch
from anywhere but the stubs would fail the boot. Stubbed on PATH, and logged: the package managers
(dnf, apt-get), systemd (systemctl), the account tools (useradd, chown), and curl, which answers
the metadata service, the one S3 object (the synthesised wheelhouse asset, the real artifact) and the
runner's release URL (a stub archive laid out as the real actions-runner-linux tarball is). Python is
real: the host's 3.11 installs the wheelhouse offline into the instance's venv, and the agent is
imported from it. The host has no 3.12, so Ubuntu's run installs with 3.11 in 3.12's place; that the
wheelhouse resolves for 3.12 (and for arm64) is checked by pip in test_agent_wheelhouse.py.

What was verified only here, and not on a real AMI: the distribution detection, package names,
curl's SigV4 request to S3 (its arguments, not AWS's answer), and the systemd units (written and
enabled, not started).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from infra.agent_wheelhouse import BOOT_PYTHONS
from runner_pool.domain.instance_settings import KNOWN_RUNNER_CHECKSUMS, InstanceSettings
from runner_pool.domain.records import Arch
from tests.infra.synthesis import Synthesis
from tests.infra.test_instances import launch_templates

REGION = "eu-west-1"
ACCOUNT = "123456789012"
ROLE = "RunnerPool-InstancesRole"
IMDS = "http://169.254.169.254/latest"
CREDENTIALS = {"AccessKeyId": "ASIATESTKEY", "SecretAccessKey": "test/secret+key", "Token": "session-token"}

AL2023_OS_RELEASE = """\
NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PLATFORM_ID="platform:al2023"
PRETTY_NAME="Amazon Linux 2023.5.20240903"
ANSI_COLOR="0;33"
CPE_NAME="cpe:2.3:o:amazon:amazon_linux:2023"
HOME_URL="https://aws.amazon.com/linux/amazon-linux-2023/"
DOCUMENTATION_URL="https://docs.aws.amazon.com/linux/"
SUPPORT_URL="https://aws.amazon.com/premiumsupport/"
BUG_REPORT_URL="https://github.com/amazonlinux/amazon-linux-2023"
VENDOR_NAME="AWS"
VENDOR_URL="https://aws.amazon.com/"
SUPPORT_END="2028-03-15"
"""
"""/etc/os-release of AL2023.5.20240903, as installdependencies.sh printed it on that AMI before it gave
up (microsoft/azure-pipelines-agent#4979). AL2023 has no /etc/redhat-release (actions/runner#2523)."""

UBUNTU_2404_OS_RELEASE = """\
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""
"""/etc/os-release of Ubuntu 24.04.1 as noble's base-files installs it (`cat /etc/os-release` on a
24.04.1 system, e.g. the kind node image's); unquoted ID and ID_LIKE, as Ubuntu writes them."""

AMAZON_LINUX_2_OS_RELEASE = (
    'NAME="Amazon Linux"\nVERSION="2"\nID="amzn"\nID_LIKE="centos rhel fedora"\nVERSION_ID="2"\n'
)
"""Amazon Linux 2's, as installdependencies.sh printed it (myoung34/docker-github-actions-runner#158)."""
DEBIAN_12_OS_RELEASE = (
    'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
)

RUNNER_ARCHIVE_LAYOUT = {
    "bin/Runner.Listener": "listener",
    "bin/Runner.Worker": "worker",
    "bin/Runner.PluginHost": "plugin host",
    "bin/installdependencies.sh": '#!/bin/bash\necho installdependencies >>"$BOOT_STUB_LOG.installdependencies"\nexit 1\n',
    "bin/runsvc.sh": "#!/bin/bash\n",
    "bin/RunnerService.js": "",
    "bin/actions.runner.service.template": "",
    "bin/systemd.svc.sh.template": "",
    "bin/update.sh.template": "",
    "externals/node20/bin/node": "node 20",
    "externals/node24/bin/node": "node 24",
    "config.sh": "#!/bin/bash\n",
    "env.sh": "#!/bin/bash\n",
    "run.sh": "#!/bin/bash\n",
    "run-helper.sh.template": "",
    "run-helper.cmd.template": "",
    "safe_sleep.sh": "#!/bin/bash\n",
}
"""The runner archive's layout: its top level as `ls` shows actions-runner-linux-x64-2.328.0 unpacked
(bin, config.sh, env.sh, externals, run-helper.cmd.template, run-helper.sh.template, run.sh,
safe_sleep.sh), bin/ from actions/runner's src/Misc/layoutbin and externals/ from src/Misc/externals.sh
at v2.328.0. Its installdependencies.sh fails as the real one does on AL2023, and says it ran."""

STUB = r"""
import json, os, shutil, sys
from pathlib import Path

log, served = os.environ["BOOT_STUB_LOG"], json.loads(Path(os.environ["BOOT_STUB_SERVED"]).read_text())
program, args = Path(sys.argv[0]).name, sys.argv[1:]
entry = {"program": program, "argv": args}
if program != "curl":
    with open(log, "a") as out:
        out.write(json.dumps(entry) + "\n")
    sys.exit(0)
options, positional, i = {}, [], 0
while i < len(args):
    arg = args[i]
    if arg in ("-o", "-H", "-X", "--retry", "--config", "--aws-sigv4"):
        options.setdefault(arg, []).append(args[i + 1])
        i += 2
        continue
    if not arg.startswith("-"):
        positional.append(arg)
    i += 1
(url,) = positional
entry.update(url=url, sigv4=options.get("--aws-sigv4"), headers=options.get("-H", []))
if options.get("--config") == ["-"]:
    entry["config"] = sys.stdin.read()
with open(log, "a") as out:
    out.write(json.dumps(entry) + "\n")
answer = served.get(url)
if answer is None:
    print(f"curl: (22) The requested URL returned error: 404 ({url})", file=sys.stderr)
    sys.exit(22)
for header in answer.get("require_headers", []):
    if header not in entry["headers"] or (answer.get("require_config") and entry.get("config") != answer["require_config"]):
        print("curl: (22) The requested URL returned error: 403", file=sys.stderr)
        sys.exit(22)
if answer.get("require_sigv4") and entry["sigv4"] != [answer["require_sigv4"]]:
    print("curl: (22) The requested URL returned error: 403", file=sys.stderr)
    sys.exit(22)
if "file" in answer:
    shutil.copyfile(answer["file"], options["-o"][0])
else:
    sys.stdout.write(answer["text"])
"""
UNSHARE = shutil.which("unshare") or "unshare"
"""util-linux's: the boot runs in a network namespace of its own (the tests run as root)."""
STUBBED = ("curl", "dnf", "apt-get", "systemctl", "useradd", "chown")


def host_python(version: str) -> Path:
    """An interpreter of `version` on this machine, to stand for the distribution's."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return Path(sys.executable).resolve()
    found = shutil.which(f"python{version}")
    if found is None:
        pytest.fail(f"the boot tests need a Python {version} on this machine")
    return Path(found).resolve()


def resolve(value: Any, refs: Mapping[str, str]) -> str:
    """A CloudFormation value with its intrinsic functions resolved: Ref by `refs`, pseudo parameters
    (in Ref and in Fn::Sub) by this test's account and region."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(resolve(part, refs) for part in value)
    ((name, argument),) = value.items()
    if name == "Fn::Join":
        return str(argument[0]).join(resolve(part, refs) for part in argument[1])
    if name == "Ref":
        pseudo_parameters = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": "aws"}
        return (
            pseudo_parameters.get(argument)
            or refs.get(argument)
            or {"AWS::URLSuffix": "amazonaws.com"}[argument]
        )
    if name == "Fn::Sub":
        pseudo = {"${AWS::AccountId}": ACCOUNT, "${AWS::Region}": REGION, "${AWS::Partition}": "aws"}
        text = str(argument)
        for key, replacement in pseudo.items():
            text = text.replace(key, replacement)
        assert "${" not in text, text
        return text
    raise AssertionError(f"no resolver for {name}")


def runner_archive(path: Path, layout: Mapping[str, str] = RUNNER_ARCHIVE_LAYOUT) -> str:
    """A gzipped tar laid out as the runner's (`tar -czf ... -C _layout .`, so every name starts with
    ./, as actions/runner's src/dev.sh packages it); its SHA-256."""
    with tarfile.open(path, "w:gz") as archive:
        for name, content in sorted(layout.items()):
            data = content.encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode = len(data), 0o755 if content.startswith("#!") else 0o644
            archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Boot:
    """One run of the user data: what it returned and everything the stubs saw."""

    root: Path
    result: subprocess.CompletedProcess[str]
    calls: list[dict[str, Any]]
    seconds: float

    def of(self, program: str) -> list[list[str]]:
        return [call["argv"] for call in self.calls if call["program"] == program]

    @property
    def fetched(self) -> list[str]:
        return [call["url"] for call in self.calls if call["program"] == "curl"]

    @property
    def failure(self) -> str | None:
        reason = self.root / "var/lib/runner-pool/boot-failed"
        return reason.read_text().strip() if reason.exists() else None

    @property
    def installdependencies_ran(self) -> bool:
        return Path(f"{self.root}/stubs/calls.jsonl.installdependencies").exists()


@dataclass(frozen=True)
class BootWorld:
    """The synthesised x64 user data, the wheelhouse asset it names, and what the stubs serve."""

    script: str
    wheelhouse: Path
    wheelhouse_url: str
    runner_url: str
    table_ref: str

    def boot(
        self,
        tmp_path: Path,
        os_release: str | None,
        *,
        runner_sha256: str | None = None,
        archive_layout: Mapping[str, str] = RUNNER_ARCHIVE_LAYOUT,
        wheelhouse: Path | None = None,
        phase: str | None = None,
        script: str | None = None,
    ) -> Boot:
        """Run the user data in the root under `tmp_path` whose /etc/os-release is `os_release` (None: none
        at all): a fresh one, or what an earlier run (a bake) left there. `runner_sha256`, when given,
        replaces the pinned checksum: the stub archive is not the release. `phase` is the script's
        argument (`bake`, as the image's component runs it); `script`, another rendering of the user data."""
        root, stubs = tmp_path / "root", tmp_path / "root" / "stubs"
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        if stubs.exists():
            shutil.rmtree(stubs)
        stubs.mkdir()
        if os_release is not None:
            (root / "etc/os-release").write_text(os_release)
        # One archive per root (gzip stamps the time), so a boot after a bake sees the bake's checksum.
        archive = tmp_path / "actions-runner.tar.gz"
        archive_sha = (
            hashlib.sha256(archive.read_bytes()).hexdigest()
            if archive.exists()
            else runner_archive(archive, archive_layout)
        )
        script = self.script if script is None else script
        if runner_sha256 is not None:
            pinned = f'readonly RUNNER_SHA256="{KNOWN_RUNNER_CHECKSUMS[InstanceSettings().runner_version][Arch.X64]}"'
            assert script.count(pinned) == 1
            script = script.replace(pinned, f'readonly RUNNER_SHA256="{runner_sha256 or archive_sha}"')
        (tmp_path / "user_data.sh").write_text(script)
        identity = {"accountId": ACCOUNT, "instanceId": "i-0abc1234def567890", "region": REGION}
        served = {
            f"{IMDS}/api/token": {"text": "imds-token"},
            f"{IMDS}/dynamic/instance-identity/document": {"text": json.dumps(identity, indent=2)},
            f"{IMDS}/meta-data/services/domain": {"text": "amazonaws.com"},
            f"{IMDS}/meta-data/iam/security-credentials/": {"text": ROLE},
            f"{IMDS}/meta-data/iam/security-credentials/{ROLE}": {"text": json.dumps(CREDENTIALS)},
            self.wheelhouse_url: {
                "file": str(wheelhouse or self.wheelhouse),
                "require_sigv4": f"aws:amz:{REGION}:s3",
                "require_headers": ["x-amz-content-sha256: UNSIGNED-PAYLOAD"],
                "require_config": (
                    f'user = "{CREDENTIALS["AccessKeyId"]}:{CREDENTIALS["SecretAccessKey"]}"\n'
                    f'header = "x-amz-security-token: {CREDENTIALS["Token"]}"\n'
                ),
            },
            self.runner_url: {"file": str(archive)},
        }
        (stubs / "served.json").write_text(json.dumps(served))
        stub = stubs / "stub.py"
        stub.write_text(f"#!{Path(sys.executable).resolve()}\n{STUB}")
        stub.chmod(0o755)
        for program in STUBBED:
            (stubs / program).symlink_to(stub)
        for version in set(BOOT_PYTHONS.values()):
            # The distribution's interpreter, by the name the boot calls it.
            (stubs / f"python{version}").symlink_to(host_python(BOOT_PYTHONS["al2023"]))
        log = stubs / "calls.jsonl"
        env = {
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "RUNNER_POOL_BOOT_ROOT": str(root),
            "TMPDIR": str(root / "tmp"),
            "HOME": str(root / "tmp"),
            "BOOT_STUB_LOG": str(log),
            "BOOT_STUB_SERVED": str(stubs / "served.json"),
            # pip must not heed these (the boot runs it --isolated), nor could it reach an index.
            "PIP_INDEX_URL": "https://pypi.org/simple",
            "PIP_FIND_LINKS": str(tmp_path / "elsewhere"),
        }
        started = time.monotonic()
        result = subprocess.run(  # noqa: S603 - the user data, in a network namespace of its own
            [UNSHARE, "--net", "--", "bash", str(tmp_path / "user_data.sh"), *([phase] if phase else [])],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        seconds = time.monotonic() - started
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return Boot(root, result, calls, seconds)


@pytest.fixture(scope="module")
def boot_world(synthesis: Synthesis) -> BootWorld:
    stack = synthesis.stack
    data = launch_templates(synthesis)[Arch.X64]
    refs = {logical: f"{logical}-ref" for logical in synthesis.resources}
    script = resolve(data["UserData"]["Fn::Base64"], refs)
    asset = stack.instances.wheelhouse_assets[Arch.X64]
    bucket = resolve(stack.resolve(asset.s3_bucket_name), refs)
    version = InstanceSettings().runner_version
    return BootWorld(
        script=script,
        wheelhouse=Path(synthesis.app.outdir) / asset.asset_path,
        wheelhouse_url=f"https://{bucket}.s3.{REGION}.amazonaws.com/{asset.s3_object_key}",
        runner_url=(
            f"https://github.com/actions/runner/releases/download/v{version}/"
            f"actions-runner-linux-x64-{version}.tar.gz"
        ),
        table_ref=next(ref for logical, ref in refs.items() if logical.startswith("StateTable")),
    )


def requirement_pins(wheelhouse: Path) -> set[str]:
    """`name==version` of every requirement the wheelhouse pins, names normalised as pip freeze prints."""
    with zipfile.ZipFile(wheelhouse) as archive:
        lines = archive.read("requirements.txt").decode().replace("\\\n", " ").splitlines()
    pins = set()
    for line in filter(None, lines):
        requirement = Requirement(line.split(" --hash")[0].strip())
        (specifier,) = requirement.specifier
        pins.add(f"{canonicalize_name(requirement.name)}=={specifier.version}")
    return pins


def installed(root: Path) -> set[str]:
    """`name==version` of every distribution the agent's venv holds, pip's own too were it there: what its
    interpreter finds on its path (isolated: no user site, no PYTHON* variable), as importlib.metadata
    lists it. The venv has no pip to ask (the boot makes it without one)."""
    listed = subprocess.run(  # noqa: S603 - the venv the boot made
        [
            str(root / "opt/runner-pool/venv/bin/python"),
            "-I",
            "-c",
            "import importlib.metadata as m\n"
            "for d in m.distributions(): print(d.metadata['Name'], d.version, sep='==')",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        f"{canonicalize_name(name)}=={version}" for name, version in (line.split("==") for line in listed)
    }


@dataclass(frozen=True)
class Distribution:
    name: str
    os_release: str
    packages: Sequence[str]
    """What the boot must install with the distribution's package manager, in one call."""


AL2023 = Distribution(
    "al2023",
    AL2023_OS_RELEASE,
    # tar and gzip for the archive, the agent's Python (not python3.11-pip: the wheelhouse brings the pip
    # that installs it), the runner's Fedora-based prerequisites from actions/runner's
    # docs/start/envlinux.md (also what terraform-aws-github-runner's start-runner.sh installs on
    # AL2023), iptables for the IMDS guard.
    [
        "tar",
        "gzip",
        "python3.11",
        "lttng-ust",
        "openssl-libs",
        "krb5-libs",
        "zlib",
        "libicu",
        "iptables-nft",
    ],
)
UBUNTU_2404 = Distribution(
    "ubuntu-24.04",
    UBUNTU_2404_OS_RELEASE,
    # envlinux.md's Debian list by noble's names: the ones noble's dotnet-runtime-8.0 depends on
    # (packages.ubuntu.com/noble/dotnet-runtime-8.0: libicu74, liblttng-ust1t64, libssl3t64, zlib1g),
    # and libkrb5-3. Not python3.12-venv: Debian's packaging (noble's too) puts the venv module in
    # libpython3.12-stdlib, which python3.12 depends on, and only ensurepip in python3.12-venv (as
    # `dpkg -L python3.11-venv` shows on bookworm); the boot makes its venv without pip.
    [
        "curl",
        "ca-certificates",
        "tar",
        "gzip",
        "python3.12",
        "liblttng-ust1t64",
        "libkrb5-3",
        "zlib1g",
        "libssl3t64",
        "libicu74",
        "chrony",
        "iptables",
    ],
)


@pytest.mark.parametrize("distribution", [AL2023, UBUNTU_2404], ids=lambda distribution: distribution.name)
def test_the_boot_installs_what_is_pinned_and_nothing_else(
    distribution: Distribution, boot_world: BootWorld, tmp_path: Path
) -> None:
    """One test per distribution, its parts below: a boot costs twenty seconds, so it runs once."""
    # Given the default x64 user data, the stub archive's checksum standing in for the release's, and
    # subordinate id ranges given before (an older image's runner account among them)
    for ranges in ("etc/subuid", "etc/subgid"):
        (tmp_path / "root" / ranges).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / ranges).write_text(SUBORDINATE_RANGES)
    # When it boots on a supported distribution, with no network but the stubs
    boot = boot_world.boot(tmp_path, distribution.os_release, runner_sha256="")
    print(f"\nboot on {distribution.name}: {boot.seconds:.1f} s")

    # Then it succeeds
    assert boot.result.returncode == 0, boot.result.stderr[-3000:]
    assert boot.failure is None
    # And each part of it did what it should
    installs_the_runners_prerequisites_itself(distribution, boot)
    fetches_only_the_pinned_runner_and_the_checked_wheelhouse(boot, boot_world)
    unpacks_the_runner_for_the_runner_user(boot)
    # (the runner account's range from before is gone; other accounts' stay)
    for ranges in ("etc/subuid", "etc/subgid"):
        assert (boot.root / ranges).read_text() == "ubuntu:100000:65536\n"
    installs_the_agent_offline_from_exactly_the_wheelhouse_pins(boot, boot_world)
    runs_the_agent_as_a_service_behind_the_metadata_guard(boot, boot_world)


def installs_the_runners_prerequisites_itself(distribution: Distribution, boot: Boot) -> None:
    # The distribution's package manager installed the runner's prerequisites, in one call
    if distribution is AL2023:
        assert boot.of("dnf") == [["install", "-y", *distribution.packages]]
        assert boot.of("apt-get") == []
        assert not (boot.root / "etc/redhat-release").exists()
    else:
        assert boot.of("apt-get") == [
            ["update", "-q"],
            ["install", "-y", "-q", "--no-install-recommends", *distribution.packages],
        ]
        assert boot.of("dnf") == []
        # with chrony set to Amazon Time Sync, for the agent's clock check
        sources = boot.root / "etc/chrony/sources.d/amazon-time-sync.sources"
        assert sources.read_text() == "server 169.254.169.123 prefer iburst minpoll 4 maxpoll 4\n"
    # And the runner's own installdependencies.sh, which exits 1 on AL2023, was not run
    assert not boot.installdependencies_ran


def fetches_only_the_pinned_runner_and_the_checked_wheelhouse(boot: Boot, boot_world: BootWorld) -> None:
    # What it fetched from outside the instance is the runner release the config pins and the
    # wheelhouse asset, once each, and nothing else
    outside = [url for url in boot.fetched if not url.startswith(IMDS)]
    assert outside == [boot_world.runner_url, boot_world.wheelhouse_url]
    # The wheelhouse was fetched with SigV4 for S3 in the instance's region, signed with the instance
    # role's credentials, which curl read from stdin (so they were never in its arguments)
    (s3,) = [call for call in boot.calls if call.get("url") == boot_world.wheelhouse_url]
    assert s3["sigv4"] == [f"aws:amz:{REGION}:s3"]
    assert CREDENTIALS["SecretAccessKey"] in s3["config"]
    assert not any(CREDENTIALS["SecretAccessKey"] in arg for call in boot.calls for arg in call["argv"])
    # Every metadata read used an IMDSv2 token
    reads = [
        call for call in boot.calls if call.get("url", "").startswith(IMDS) and "api/token" not in call["url"]
    ]
    assert reads
    assert all("X-aws-ec2-metadata-token: imds-token" in call["headers"] for call in reads)


SUBORDINATE_RANGES = "ubuntu:100000:65536\nrunner:165536:65536\n"


def unpacks_the_runner_for_the_runner_user(boot: Boot) -> None:
    runner = boot.root / "opt/actions-runner"
    # The runner directory is the archive's layout, plus _work
    unpacked = {str(path.relative_to(runner)) for path in runner.rglob("*") if path.is_file()}
    assert unpacked == set(RUNNER_ARCHIVE_LAYOUT)
    assert (runner / "_work").is_dir()
    assert (runner / "_diag").is_dir()
    # The runner user was created; the program is root's and no file of it is writable by the user;
    # the top directory is root:runner with the sticky bit, _work and _diag the runner user's
    # with no subordinate uid or gid range (login.defs SUB_UID_COUNT, SUB_GID_COUNT)
    assert boot.of("useradd") == [
        ["--create-home", "--shell", "/bin/bash", "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", "runner"]
    ]
    assert boot.of("chown") == [
        ["-R", "root:root", str(runner)],
        ["root:runner", str(runner)],
        ["runner:runner", str(runner / "_work"), str(runner / "_diag")],
    ]
    assert oct(runner.stat().st_mode & 0o7777) == "0o1775"
    assert not [path for path in runner.rglob("*") if path.stat().st_mode & 0o022]
    # And a manifest records every file of it as installed, for the agent to check the runner against
    manifest = json.loads((boot.root / "etc/runner-pool/runner-manifest.json").read_text())
    assert {name for name, entry in manifest.items() if entry["kind"] == "file"} == set(RUNNER_ARCHIVE_LAYOUT)
    assert all(entry["sha256"] for entry in manifest.values() if entry["kind"] == "file")


def installs_the_agent_offline_from_exactly_the_wheelhouse_pins(boot: Boot, boot_world: BootWorld) -> None:
    # The agent's venv holds exactly the wheelhouse's pins: uv.lock's runtime dependencies and the
    # project itself, and not the pip that installed them
    pins = requirement_pins(boot_world.wheelhouse)
    assert "runner-pool==0.1.0" in pins
    assert installed(boot.root) == pins
    # The agent imports from it, with no network either
    subprocess.run(  # noqa: S603 - the venv the boot made
        [
            UNSHARE,
            "--net",
            "--",
            str(boot.root / "opt/runner-pool/venv/bin/python"),
            "-I",
            "-c",
            "import agent.__main__, agent.jit_config, agent.loop, runner_pool.adapters.state_table",
        ],
        check=True,
    )


def runs_the_agent_as_a_service_behind_the_metadata_guard(boot: Boot, boot_world: BootWorld) -> None:
    units = boot.root / "etc/systemd/system"
    # The agent's unit runs the venv's agent, after the metadata guard and requiring it
    agent = (units / "runner-pool-agent.service").read_text()
    assert f"ExecStart={boot.root}/opt/runner-pool/venv/bin/python -m agent\n" in agent
    assert "Requires=runner-pool-imds-guard.service\nAfter=runner-pool-imds-guard.service\n" in agent
    assert (units / "runner-pool-imds-guard.service").exists()
    # systemd was asked to enable and start both
    assert ["enable", "--now", "runner-pool-imds-guard.service"] in boot.of("systemctl")
    assert ["enable", "--now", "runner-pool-agent.service"] in boot.of("systemctl")
    # The agent's settings name this stack's table and the instance's region
    settings = (boot.root / "etc/runner-pool/agent.env").read_text()
    assert f"RUNNER_POOL_TABLE_NAME={boot_world.table_ref}\n" in settings
    assert f"RUNNER_POOL_REGION={REGION}\n" in settings
    # And the URL of its notice queue up to its instance id, in SQS's shape (runner_pool.domain.notices)
    assert re.search(
        rf"^RUNNER_POOL_NOTICE_QUEUE_URL_PREFIX=https://sqs\.{REGION}\.amazonaws\.com/{ACCOUNT}/[\w-]+-notice-$",
        settings,
        re.MULTILINE,
    )
    # And the agent checks the runner against its manifest, and starts it as a sandboxed service of its
    # own (agent/sandbox.py), not in a cgroup below the agent's
    assert f"RUNNER_POOL_RUNNER_MANIFEST={boot.root}/etc/runner-pool/runner-manifest.json\n" in settings
    assert "RUNNER_POOL_JOB_UNIT=runner-pool-job\n" in settings
    # And it checks its clock with chrony's client at boot (agent/clock_check.py)
    assert f"RUNNER_POOL_CHRONYC={boot.root}/usr/bin/chronyc\n" in settings
    assert "RUNNER_POOL_JOB_CGROUP" not in settings
    assert "Delegate=" not in agent


@pytest.mark.parametrize(
    ("os_release", "named"),
    [
        (AMAZON_LINUX_2_OS_RELEASE, "'amzn 2'"),
        (DEBIAN_12_OS_RELEASE, "'debian 12'"),
        (None, "no "),
    ],
    ids=["amazon-linux-2", "debian-12", "no-os-release"],
)
def test_an_unsupported_distribution_fails_the_boot_with_its_reason_before_installing_anything(
    boot_world: BootWorld, tmp_path: Path, os_release: str | None, named: str
) -> None:
    # When the user data boots on a distribution it does not support
    boot = boot_world.boot(tmp_path, os_release)

    # Then the boot fails, saying which distribution and which it supports, on the console and on disk
    assert boot.result.returncode == 1
    assert boot.failure is not None
    assert named in boot.failure
    assert "Amazon Linux 2023 and Ubuntu 24.04" in boot.failure
    assert f"runner-pool UD_FAILED: {boot.failure}" in boot.result.stderr
    # And nothing was installed or fetched
    assert [call["program"] for call in boot.calls] == []


def test_the_default_user_data_refuses_a_runner_archive_that_is_not_the_release(
    boot_world: BootWorld, tmp_path: Path
) -> None:
    # Given the default user data as synthesised, pinned to the v2.328.0 release's checksum
    # When the archive downloaded is not that release (here, the stub archive)
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE)

    # Then the boot fails, naming the archive and the checksum it expected, and unpacks nothing
    assert boot.result.returncode == 1
    assert boot.failure is not None
    assert "does not have the pinned SHA-256" in boot.failure
    assert KNOWN_RUNNER_CHECKSUMS["2.328.0"][Arch.X64] in boot.failure
    assert not (boot.root / "opt/actions-runner/bin").exists()


def test_a_wheelhouse_that_is_not_the_one_synthesised_is_refused_before_it_is_unpacked(
    boot_world: BootWorld, tmp_path: Path
) -> None:
    # Given a wheelhouse object changed after synth (one byte appended)
    altered = tmp_path / "altered.zip"
    altered.write_bytes(boot_world.wheelhouse.read_bytes() + b"\0")

    # When the user data boots and downloads it
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE, runner_sha256="", wheelhouse=altered)

    # Then the boot fails on the wheelhouse's checksum, and neither unpacks it nor makes the venv
    assert boot.result.returncode == 1
    assert boot.failure is not None
    assert "does not have the SHA-256" in boot.failure
    assert not (boot.root / "opt/runner-pool/wheelhouse").exists()
    assert not (boot.root / "opt/runner-pool/venv").exists()


def test_a_wheelhouse_without_the_pip_to_install_it_with_fails_the_boot_before_making_the_venv(
    boot_world: BootWorld, tmp_path: Path
) -> None:
    # Given a wheelhouse that lacks its installer/ pip wheel, and user data that pins that very zip (as a
    # builder that lost the wheel would have synthesised it)
    stripped = tmp_path / "stripped.zip"
    with zipfile.ZipFile(boot_world.wheelhouse) as source, zipfile.ZipFile(stripped, "w") as target:
        for entry in source.infolist():
            if not entry.filename.startswith("installer/"):
                target.writestr(entry, source.read(entry))
    digest = hashlib.sha256(stripped.read_bytes()).hexdigest()
    script, pinned = re.subn(
        r'readonly WHEELHOUSE_SHA256="[0-9a-f]{64}"',
        f'readonly WHEELHOUSE_SHA256="{digest}"',
        boot_world.script,
    )
    assert pinned == 1

    # When the user data boots with it
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE, runner_sha256="", wheelhouse=stripped, script=script)

    # Then the boot fails, saying the pip is missing, and makes no venv
    assert boot.result.returncode == 1
    assert boot.failure is not None
    assert "no single pip wheel" in boot.failure
    assert not (boot.root / "opt/runner-pool/venv").exists()


# --- on the runner image ----------------------------------------------------------------------------
# The image's component runs this same user data with `bake` (infra/constructs/runner_image.py); an
# instance launched from the image runs it again at boot, with no argument.

BAKED = "var/lib/runner-pool/baked"
PARTS = ("packages", "runner", "agent")


@dataclass(frozen=True)
class BakedImage:
    """A root as the image's bake left it, and what the bake did."""

    root_parent: Path
    bake: Boot


@pytest.fixture(scope="module")
def baked_image(boot_world: BootWorld, tmp_path_factory: pytest.TempPathFactory) -> BakedImage:
    directory = tmp_path_factory.mktemp("image")
    bake = boot_world.boot(directory, AL2023_OS_RELEASE, runner_sha256="", phase="bake")
    return BakedImage(directory, bake)


def launched_from(image: BakedImage, tmp_path: Path) -> Path:
    """A new instance's disk: a copy of the image's root (and its archive), under `tmp_path`."""
    shutil.copytree(image.root_parent, tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path


def test_the_bake_installs_every_part_and_records_its_pins_but_starts_nothing(
    baked_image: BakedImage, boot_world: BootWorld
) -> None:
    # Given the user data run with `bake` on AL2023 (the image's build instance)
    bake = baked_image.bake

    # Then it succeeds, having installed the packages, the runner and the agent as a boot would
    assert bake.result.returncode == 0, bake.result.stderr[-3000:]
    installs_the_runners_prerequisites_itself(AL2023, bake)
    fetches_only_the_pinned_runner_and_the_checked_wheelhouse(bake, boot_world)
    unpacks_the_runner_for_the_runner_user(bake)
    installs_the_agent_offline_from_exactly_the_wheelhouse_pins(bake, boot_world)
    # And it recorded the pins of each part
    records = {part: (bake.root / BAKED / part).read_text().strip() for part in PARTS}
    assert records["runner"].startswith(f"{InstanceSettings().runner_version} x64 ")
    assert records["agent"] == hashlib.sha256(boot_world.wheelhouse.read_bytes()).hexdigest()
    assert records["packages"].startswith("al2023 ")
    # And it configured and started nothing: no guard, no agent unit, no agent settings (a deploy's own)
    assert bake.of("systemctl") == []
    assert not (bake.root / "etc/systemd/system/runner-pool-agent.service").exists()
    assert not (bake.root / "etc/runner-pool/agent.env").exists()


def test_a_boot_on_a_current_image_only_configures_and_starts_the_agent(
    baked_image: BakedImage, boot_world: BootWorld, tmp_path: Path
) -> None:
    # Given an instance launched from an image baked at the user data's pins
    launched_from(baked_image, tmp_path)

    # When it boots
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE, runner_sha256="")
    print(f"\nboot on the image: {boot.seconds:.1f} s (bake: {baked_image.bake.seconds:.1f} s)")

    # Then it installs nothing: no package, no download, no account, no unpacking
    assert boot.result.returncode == 0, boot.result.stderr[-3000:]
    assert [program for program in ("dnf", "apt-get", "useradd", "chown") if boot.of(program)] == []
    assert [url for url in boot.fetched if not url.startswith(IMDS)] == []
    # And the agent the image holds is the wheelhouse's, as baked
    assert installed(boot.root) == requirement_pins(boot_world.wheelhouse)
    # And it configures and starts the agent behind the metadata guard, as any boot does
    runs_the_agent_as_a_service_behind_the_metadata_guard(boot, boot_world)


def test_a_boot_on_an_image_baked_at_an_older_runner_reinstalls_the_runner_alone(
    baked_image: BakedImage, boot_world: BootWorld, tmp_path: Path
) -> None:
    # Given an instance of an image baked before the deploy pinned this runner (its record and a file
    # of its runner differ)
    root = launched_from(baked_image, tmp_path) / "root"
    (root / BAKED / "runner").write_text(f"2.327.0 x64 {'0' * 64}\n")
    (root / "opt/actions-runner/bin/Runner.Old").write_text("the old release's")

    # When it boots
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE, runner_sha256="")

    # Then it installs the pinned runner in place of the old one, and nothing else
    assert boot.result.returncode == 0, boot.result.stderr[-3000:]
    assert [url for url in boot.fetched if not url.startswith(IMDS)] == [boot_world.runner_url]
    assert boot.of("dnf") == []
    assert not (root / "opt/actions-runner/bin/Runner.Old").exists()
    unpacks_the_runner_for_the_runner_user(boot)
    # And records the runner at its new pins, and starts the agent
    assert (root / BAKED / "runner").read_text().startswith(f"{InstanceSettings().runner_version} x64 ")
    assert ["enable", "--now", "runner-pool-agent.service"] in boot.of("systemctl")


def test_an_unknown_phase_fails_before_installing_anything(boot_world: BootWorld, tmp_path: Path) -> None:
    # When the user data is run with an argument it does not know
    boot = boot_world.boot(tmp_path, AL2023_OS_RELEASE, phase="install")

    # Then it fails, saying so, and nothing was installed or fetched
    assert boot.result.returncode == 1
    assert boot.failure is not None
    assert "unknown phase 'install'" in boot.failure
    assert boot.calls == []
