#!/bin/bash
# runner-pool instance bootstrap: installs the GitHub Actions runner and the runner-pool agent, and
# starts the agent as a systemd service. It never registers a runner itself: the agent does that
# for each run that claims the instance (DESIGN.md section 5).
#
# A template: infra/constructs/instances.py replaces each placeholder (a name in capitals between
# two at signs) before it becomes the launch template's user data. Instance metadata is read with
# IMDSv2 session tokens only, and (unless the stack config turns it off) by root alone: jobs run as
# the runner user and must not act as the instance. Jobs that need AWS use GitHub's OIDC provider.
set -euo pipefail
trap 'echo "runner-pool bootstrap failed at line ${LINENO}" >&2' ERR

readonly RUNNER_VERSION="@RUNNER_VERSION@"
readonly RUNNER_ARCH="@RUNNER_ARCH@"
readonly RUNNER_SHA256="@RUNNER_SHA256@"
readonly AGENT_SOURCE_BUCKET="@AGENT_SOURCE_BUCKET@"
readonly AGENT_SOURCE_KEY="@AGENT_SOURCE_KEY@"
readonly PRE_RUNNER_SCRIPT_BASE64="@PRE_RUNNER_SCRIPT_BASE64@"
readonly BLOCK_IMDS_FROM_JOBS="@BLOCK_IMDS_FROM_JOBS@"

readonly RUNNER_USER="runner"
readonly RUNNER_DIR="/opt/actions-runner"
readonly AGENT_HOME="/opt/runner-pool"
readonly CONFIG_DIR="/etc/runner-pool"
readonly IMDS="http://169.254.169.254"
readonly IMDS_GUARD="/usr/local/sbin/runner-pool-imds-guard"
readonly AGENT_UNIT="runner-pool-agent.service"
readonly IMDS_GUARD_UNIT="runner-pool-imds-guard.service"

imds() {
    local token
    token="$(curl -fsS --retry 5 -X PUT "${IMDS}/latest/api/token" \
        -H "X-aws-ec2-metadata-token-ttl-seconds: 300")"
    curl -fsS --retry 5 -H "X-aws-ec2-metadata-token: ${token}" "${IMDS}/latest/$1"
}

install_packages() {
    if command -v dnf >/dev/null 2>&1; then
        dnf install -y "$@"
    elif command -v apt-get >/dev/null 2>&1; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
    else
        echo "no dnf or apt-get on this image; install $* into the AMI" >&2
        return 1
    fi
}

# The agent needs Python 3.11 or later; AL2023's default python3 is 3.9, so 3.11 comes alongside.
agent_python() {
    local candidate
    for candidate in python3.13 python3.12 python3.11; do
        if command -v "${candidate}" >/dev/null 2>&1; then
            command -v "${candidate}"
            return 0
        fi
    done
    return 1
}

install_prerequisites() {
    if command -v dnf >/dev/null 2>&1; then
        install_packages python3.11 python3.11-pip tar gzip
    else
        install_packages python3 python3-venv curl tar gzip
    fi
}

install_runner() {
    local archive="actions-runner-linux-${RUNNER_ARCH}-${RUNNER_VERSION}.tar.gz"
    local url="https://github.com/actions/runner/releases/download/v${RUNNER_VERSION}/${archive}"
    id -u "${RUNNER_USER}" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "${RUNNER_USER}"
    mkdir -p "${RUNNER_DIR}"
    curl -fsSL --retry 5 -o "/tmp/${archive}" "${url}"
    if [[ -n "${RUNNER_SHA256}" ]]; then
        echo "${RUNNER_SHA256}  /tmp/${archive}" | sha256sum --check --strict
    fi
    tar -xzf "/tmp/${archive}" -C "${RUNNER_DIR}"
    rm -f "/tmp/${archive}"
    "${RUNNER_DIR}/bin/installdependencies.sh"
    mkdir -p "${RUNNER_DIR}/_work"
    chown -R "${RUNNER_USER}:${RUNNER_USER}" "${RUNNER_DIR}"
}

# The instance role may write this instance's signals and read its runner config, and anyone who
# reaches the metadata service gets its credentials. A job runs as the runner user; only root (the
# agent) may reach the service. A oneshot unit sets the rule at every boot, before the agent starts,
# and the agent's unit requires it: without the rule no agent, so no runner, ever starts. (Containers
# on a bridge network are already cut off by the launch template's hop limit of 1.)
install_imds_guard() {
    if command -v dnf >/dev/null 2>&1; then
        install_packages iptables-nft
    else
        install_packages iptables
    fi
    cat >"${IMDS_GUARD}" <<'GUARD'
#!/bin/bash
# runner-pool: only root may reach the instance metadata service (IPv4, and IPv6 where it is on).
set -euo pipefail
guard() {
    local tables="$1" address="$2"
    local rule=(OUTPUT --destination "${address}" -m owner ! --uid-owner 0 -j REJECT)
    "${tables}" -w -C "${rule[@]}" 2>/dev/null || "${tables}" -w -I "${rule[@]}"
}
guard iptables 169.254.169.254/32
# The IPv6 endpoint answers only where the launch template turns it on (ours does not): best effort.
if command -v ip6tables >/dev/null 2>&1; then
    guard ip6tables fd00:ec2::254/128 || echo "runner-pool: IPv6 metadata guard not set" >&2
fi
GUARD
    chmod 0755 "${IMDS_GUARD}"
    cat >"/etc/systemd/system/${IMDS_GUARD_UNIT}" <<UNIT
[Unit]
Description=runner-pool: only root may reach the instance metadata service
Before=${AGENT_UNIT}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=${IMDS_GUARD}

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable --now "${IMDS_GUARD_UNIT}"
}

# The agent's source is a CDK asset in the stack's asset bucket; pip builds the project's wheel
# from it, so the instance runs the same code, and the same record models, as the control plane.
install_agent() {
    local region="$1"
    local python
    python="$(agent_python)"
    mkdir -p "${AGENT_HOME}/source"
    "${python}" -m venv "${AGENT_HOME}/venv"
    "${AGENT_HOME}/venv/bin/pip" install --quiet --upgrade pip boto3
    "${AGENT_HOME}/venv/bin/python" - "${region}" "${AGENT_SOURCE_BUCKET}" "${AGENT_SOURCE_KEY}" \
        "${AGENT_HOME}/agent-source.zip" <<'PYTHON'
import sys

import boto3

region, bucket, key, target = sys.argv[1:]
boto3.client("s3", region_name=region).download_file(bucket, key, target)
PYTHON
    "${AGENT_HOME}/venv/bin/python" -m zipfile -e "${AGENT_HOME}/agent-source.zip" "${AGENT_HOME}/source"
    "${AGENT_HOME}/venv/bin/pip" install --quiet "${AGENT_HOME}/source"
}

write_agent_settings() {
    local region="$1"
    mkdir -p "${CONFIG_DIR}"
    if [[ -n "${PRE_RUNNER_SCRIPT_BASE64}" ]]; then
        echo "${PRE_RUNNER_SCRIPT_BASE64}" | base64 --decode >"${CONFIG_DIR}/pre-runner.sh"
        chmod 0755 "${CONFIG_DIR}/pre-runner.sh"
    fi
    cat >"${CONFIG_DIR}/agent.env" <<SETTINGS
RUNNER_POOL_TABLE_NAME=@TABLE_NAME@
RUNNER_POOL_CREDENTIALS_KEY_ID=@CREDENTIALS_KEY_ID@
RUNNER_POOL_REGION=${region}
RUNNER_POOL_HEARTBEAT_PERIOD_SECONDS=@HEARTBEAT_PERIOD_SECONDS@
RUNNER_POOL_TERMINATION_GRACE_SECONDS=@TERMINATION_GRACE_SECONDS@
RUNNER_POOL_RETENTION_DAYS=@RETENTION_DAYS@
RUNNER_POOL_RUNNER_DIR=${RUNNER_DIR}
RUNNER_POOL_RUNNER_USER=${RUNNER_USER}
SETTINGS
    if [[ -n "${PRE_RUNNER_SCRIPT_BASE64}" ]]; then
        echo "RUNNER_POOL_PRE_RUNNER_SCRIPT=${CONFIG_DIR}/pre-runner.sh" >>"${CONFIG_DIR}/agent.env"
    fi
}

install_service() {
    local guard=""
    if [[ "${BLOCK_IMDS_FROM_JOBS}" == "true" ]]; then
        guard="Requires=${IMDS_GUARD_UNIT}
After=${IMDS_GUARD_UNIT}"
    fi
    cat >"/etc/systemd/system/${AGENT_UNIT}" <<UNIT
[Unit]
Description=runner-pool agent: heartbeat, runner registration and cleanup for this instance
Wants=network-online.target
After=network-online.target
${guard}

[Service]
Type=simple
EnvironmentFile=${CONFIG_DIR}/agent.env
ExecStart=${AGENT_HOME}/venv/bin/python -m agent
Restart=always
RestartSec=2
# The runner and its job live in the agent's control group: stopping the agent stops them too,
# the agent first (SIGTERM), everything left a little later.
KillMode=mixed
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable --now "${AGENT_UNIT}"
}

main() {
    local region
    region="$(imds dynamic/instance-identity/document | sed -n 's/.*"region" *: *"\([^"]*\)".*/\1/p')"
    install_prerequisites
    if [[ "${BLOCK_IMDS_FROM_JOBS}" == "true" ]]; then
        install_imds_guard
    fi
    install_runner
    install_agent "${region}"
    write_agent_settings "${region}"
    install_service
}

main "$@"
