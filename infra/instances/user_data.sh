#!/bin/bash
# runner-pool instance bootstrap: installs the GitHub Actions runner and the runner-pool agent, and
# starts the agent as a systemd service. It never registers a runner itself: the agent does that
# for each run that claims the instance (DESIGN.md section 5).
#
# A template: infra/constructs/instances.py replaces each placeholder (a name in capitals between
# two at signs) before it becomes the launch template's user data. Instance metadata is read with
# IMDSv2 session tokens only, and (unless the stack config turns it off) by root alone: jobs run as
# the runner user and must not act as the instance. Jobs that need AWS use GitHub's OIDC provider.
#
# What an instance runs is fixed at synth: the runner release the config pins, checked against its
# SHA-256; the agent and its dependencies from a wheelhouse built from uv.lock, checked against its
# SHA-256 and installed offline by the pip wheel it carries, each wheel against the hash its
# requirements file pins. Nothing is installed from a package index. The distribution's own packages
# come from its signed repositories.
#
# Two phases. `bake` (the runner image's Image Builder component runs this script with that argument,
# infra/constructs/runner_image.py) installs the three parts and records, for each, the pins it was
# installed at under BAKED_DIR. The boot (cloud-init runs it with no argument) installs only the parts
# whose record is missing or differs from this script's pins, so on a current image it only configures
# and starts the agent, on a base AMI (no image built yet) it installs everything, and on an image
# baked at older pins it reinstalls just what changed.
set -Eeuo pipefail

readonly RUNNER_VERSION="@RUNNER_VERSION@"
readonly RUNNER_ARCH="@RUNNER_ARCH@"
readonly RUNNER_SHA256="@RUNNER_SHA256@"
readonly WHEELHOUSE_BUCKET="@WHEELHOUSE_BUCKET@"
readonly WHEELHOUSE_KEY="@WHEELHOUSE_KEY@"
readonly WHEELHOUSE_SHA256="@WHEELHOUSE_SHA256@"
readonly AL2023_PYTHON="@AL2023_PYTHON@"
readonly UBUNTU_PYTHON="@UBUNTU_PYTHON@"
readonly PRE_RUNNER_SCRIPT_BASE64="@PRE_RUNNER_SCRIPT_BASE64@"
readonly BLOCK_IMDS_FROM_JOBS="@BLOCK_IMDS_FROM_JOBS@"

# Every path the boot reads or writes is under ROOT: the file system's root on an instance (where
# nothing sets RUNNER_POOL_BOOT_ROOT), a throwaway directory in the boot tests.
readonly ROOT="${RUNNER_POOL_BOOT_ROOT:-}"
readonly OS_RELEASE="${ROOT}/etc/os-release"
readonly RUNNER_USER="runner"
readonly RUNNER_DIR="${ROOT}/opt/actions-runner"
readonly AGENT_HOME="${ROOT}/opt/runner-pool"
readonly CONFIG_DIR="${ROOT}/etc/runner-pool"
readonly RUNNER_MANIFEST="${CONFIG_DIR}/runner-manifest.json"
readonly STATE_DIR="${ROOT}/var/lib/runner-pool"
readonly BAKED_DIR="${STATE_DIR}/baked"
readonly UNIT_DIR="${ROOT}/etc/systemd/system"
readonly CHRONYC="${ROOT}/usr/bin/chronyc"
readonly IMDS_GUARD="${ROOT}/usr/local/sbin/runner-pool-imds-guard"
readonly IMDS="http://169.254.169.254"
readonly AGENT_UNIT="runner-pool-agent.service"
readonly IMDS_GUARD_UNIT="runner-pool-imds-guard.service"
readonly SUPPORTED="Amazon Linux 2023 and Ubuntu 24.04"

DISTRO=""
AGENT_PYTHON=""
WORK=""

# A boot that fails leaves no agent to write UD_FAILED, so it says why where an operator looks: the
# console (cloud-init's output, `aws ec2 get-console-output`) and the file boot-failed, which keeps
# the first reason (a failure inside a command substitution stops its caller too). The instance
# never heartbeats, so provisioning gives up on it and terminates it.
fail() {
    echo "runner-pool UD_FAILED: $*" >&2
    mkdir -p "${STATE_DIR}"
    [[ -e "${STATE_DIR}/boot-failed" ]] || echo "$*" >"${STATE_DIR}/boot-failed"
    exit 1
}
trap 'fail "the boot stopped at line ${LINENO}: ${BASH_COMMAND}"' ERR

imds() {
    local token
    token="$(curl -fsS --retry 5 -X PUT "${IMDS}/latest/api/token" \
        -H "X-aws-ec2-metadata-token-ttl-seconds: 300")"
    curl -fsS --retry 5 -H "X-aws-ec2-metadata-token: ${token}" "${IMDS}/latest/$1"
}

# One field of os-release(5), unquoted; the file is read, never sourced.
os_release() {
    sed -n "s/^$1=//p" "${OS_RELEASE}" | head -n 1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}

# The runner's own bin/installdependencies.sh tells Red Hat-likes by /etc/redhat-release, which Amazon
# Linux 2023 does not have, and exits 1 there (actions/runner#2511, open). So the boot installs the
# runner's prerequisites itself, for the distributions it knows by os-release's ID and VERSION_ID,
# and refuses any other before it installs anything.
detect_distribution() {
    [[ -r "${OS_RELEASE}" ]] || fail "no ${OS_RELEASE} to tell the distribution by; runner-pool boots ${SUPPORTED}"
    local id version
    id="$(os_release ID)"
    version="$(os_release VERSION_ID)"
    case "${id} ${version}" in
        "amzn 2023") DISTRO="al2023" ;;
        "ubuntu 24.04") DISTRO="ubuntu-24.04" ;;
        *) fail "unsupported distribution '${id} ${version}' (by ${OS_RELEASE}); runner-pool boots ${SUPPORTED}" ;;
    esac
}

# The runner's .NET prerequisites are the lists of actions/runner's docs/start/envlinux.md: its
# Fedora-based list on AL2023 (the packages the runner's script would install on Fedora), and on
# Ubuntu 24.04 the noble names of its Debian list (libssl3t64, liblttng-ust1t64 and libicu74, as
# noble's dotnet-runtime-8.0 depends on them). The agent's Python is AL2023_PYTHON or UBUNTU_PYTHON,
# the interpreters the wheelhouse was built for (infra/agent_wheelhouse.py BOOT_PYTHONS), and nothing
# else of Python: the venv module is in the interpreter's own packages (python3.X-libs on AL2023,
# libpython3.X-stdlib on Ubuntu), and a venv made without pip needs neither the distribution's pip
# (python3.X-pip) nor its ensurepip (Ubuntu's python3.X-venv): the wheelhouse brings its own pip.
# The agent checks the clock with chrony at boot (agent/clock_check.py): AL2023 has it, set to Amazon
# Time Sync; on Ubuntu it is installed with the Time Sync server the EC2 User Guide gives ("Set the time
# reference on your EC2 instance to use the local Amazon Time Sync Service"), in the sources directory
# Ubuntu's chrony.conf reads, written first so that chronyd starts with it.
install_prerequisites() {
    case "${DISTRO}" in
        al2023)
            local packages=(tar gzip "python${AL2023_PYTHON}" lttng-ust openssl-libs krb5-libs zlib libicu)
            if [[ "${BLOCK_IMDS_FROM_JOBS}" == "true" ]]; then
                packages+=(iptables-nft)
            fi
            # AL2023 ships curl-minimal, which the boot uses; the curl package would conflict with it.
            dnf install -y "${packages[@]}"
            ;;
        ubuntu-24.04)
            local packages=(curl ca-certificates tar gzip "python${UBUNTU_PYTHON}"
                liblttng-ust1t64 libkrb5-3 zlib1g libssl3t64 libicu74 chrony)
            if [[ "${BLOCK_IMDS_FROM_JOBS}" == "true" ]]; then
                packages+=(iptables)
            fi
            mkdir -p "${ROOT}/etc/chrony/sources.d"
            echo "server 169.254.169.123 prefer iburst minpoll 4 maxpoll 4" \
                >"${ROOT}/etc/chrony/sources.d/amazon-time-sync.sources"
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
            ;;
    esac
}

select_agent_python() {
    case "${DISTRO}" in
        al2023) AGENT_PYTHON="python${AL2023_PYTHON}" ;;
        ubuntu-24.04) AGENT_PYTHON="python${UBUNTU_PYTHON}" ;;
    esac
}

# What each part is installed at: a part whose record under BAKED_DIR says the same was installed by
# the image's bake (or an earlier boot) and is not installed again.
pins_of() {
    case "$1" in
        packages) echo "${DISTRO} python ${AL2023_PYTHON}/${UBUNTU_PYTHON} imds-guard ${BLOCK_IMDS_FROM_JOBS}" ;;
        runner) echo "${RUNNER_VERSION} ${RUNNER_ARCH} ${RUNNER_SHA256}" ;;
        agent) echo "${WHEELHOUSE_SHA256}" ;;
    esac
}

installed_at_pins() {
    [[ -f "${BAKED_DIR}/$1" && "$(cat "${BAKED_DIR}/$1")" == "$(pins_of "$1")" ]]
}

record_pins() {
    mkdir -p "${BAKED_DIR}"
    pins_of "$1" >"${BAKED_DIR}/$1"
}

# The runner account gets no subordinate uid or gid range (subuid(5), subgid(5)): with one, its user
# namespaces could act as uids that no account has and the scrub does not track. useradd gives a new
# user one unless SUB_UID_COUNT and SUB_GID_COUNT are 0 (login.defs(5); -K overrides login.defs for
# this call, useradd(8)), and an account made before this rule loses its lines. The agent's scrub
# refuses the instance should a line for it appear.
create_runner_account() {
    id -u "${RUNNER_USER}" >/dev/null 2>&1 \
        || useradd --create-home --shell /bin/bash -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 "${RUNNER_USER}"
    local file
    for file in "${ROOT}/etc/subuid" "${ROOT}/etc/subgid"; do
        if [[ -f "${file}" ]]; then
            sed -i "/^${RUNNER_USER}:/d" "${file}"
        fi
    done
}

install_runner() {
    local archive="actions-runner-linux-${RUNNER_ARCH}-${RUNNER_VERSION}.tar.gz"
    local url="https://github.com/actions/runner/releases/download/v${RUNNER_VERSION}/${archive}"
    [[ "${RUNNER_SHA256}" =~ ^[0-9a-f]{64}$ ]] || fail "no SHA-256 to check ${archive} by; not installing it"
    create_runner_account
    curl -fsSL --retry 5 -o "${WORK}/${archive}" "${url}"
    echo "${RUNNER_SHA256}  ${WORK}/${archive}" | sha256sum --check --strict --quiet \
        || fail "${archive} from ${url} does not have the pinned SHA-256 ${RUNNER_SHA256}; not installing it"
    mkdir -p "${RUNNER_DIR}"
    tar -xzf "${WORK}/${archive}" -C "${RUNNER_DIR}"
    # The runner's program is root's and read-only to the runner account, so no job can change what
    # the next job's runner runs. The top directory is root:runner with the sticky bit: the runner adds
    # and removes its own files there (run.sh writes run-helper.sh, the listener its settings), never
    # root's; the agent removes whatever the manifest below does not name (agent/runner_install.py).
    chown -R root:root "${RUNNER_DIR}"
    chmod -R go-w "${RUNNER_DIR}"
    chown "root:${RUNNER_USER}" "${RUNNER_DIR}"
    chmod 1775 "${RUNNER_DIR}"
    mkdir -p "${RUNNER_DIR}/_work" "${RUNNER_DIR}/_diag"
    chown "${RUNNER_USER}:${RUNNER_USER}" "${RUNNER_DIR}/_work" "${RUNNER_DIR}/_diag"
}

# Every file of the runner as installed, hashed: the agent checks the runner against it before each
# start and after each job, and refuses to serve another job when it differs.
record_runner_manifest() {
    mkdir -p "${CONFIG_DIR}"
    "${AGENT_HOME}/venv/bin/python" -m agent.runner_install "${RUNNER_DIR}" "${RUNNER_MANIFEST}"
}

# The instance profile's credentials as a curl config (user and session token), read on stdin so
# that they never appear in a process list.
credentials_as_curl_config() {
    "${AGENT_PYTHON}" -c '
import json, sys
credentials = json.load(sys.stdin)
print("user = \"" + credentials["AccessKeyId"] + ":" + credentials["SecretAccessKey"] + "\"")
print("header = \"x-amz-security-token: " + credentials["Token"] + "\"")
'
}

# The one S3 object the instance role may read, signed by curl itself (--aws-sigv4, in curl since
# 7.75; AL2023 and Ubuntu 24.04 ship curl 8): no AWS CLI or SDK is needed, nor installed from an index.
s3_get() {
    local region="$1" key="$2" target="$3"
    local domain role
    domain="$(imds meta-data/services/domain)"
    role="$(imds meta-data/iam/security-credentials/)"
    imds "meta-data/iam/security-credentials/${role}" | credentials_as_curl_config \
        | curl -fsS --retry 5 --config - --aws-sigv4 "aws:amz:${region}:s3" \
            -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o "${target}" \
            "https://${WHEELHOUSE_BUCKET}.s3.${region}.${domain}/${key}"
}

# The agent's wheelhouse (a CDK asset built from uv.lock by infra/agent_wheelhouse.py) is checked
# whole against the SHA-256 synth saw, then pip installs it with no index: every wheel must match
# the hash requirements.txt pins for it, and nothing else can be installed. --isolated keeps pip's
# environment variables and configuration files out of it. --no-compile halves the install (the
# agent, running as root, compiles what it imports on first import).
#
# The venv is made without pip: ensurepip would install and byte-compile a pip (and on 3.11
# setuptools) that the agent never uses, half of the install's time. The pip that installs the
# wheelhouse is the wheel uv.lock pins, carried in the wheelhouse (installer/) and run straight
# from it by the venv's interpreter, so it installs into the venv and stays out of it: pip's
# __main__ puts its own wheel on sys.path for `python pip-*.whl/pip` (pypa/pip src/pip/__main__.py),
# which zipimport allows (a sys.path entry may be a path inside a zip: Python docs, zipimport), as
# CPython's ensurepip runs pip from its bundled wheel. The wheel runs only once its zip's SHA-256
# is checked, unpacked by root into a directory only root writes, so it is the locked file
# (agent_wheelhouse.py refused any download whose digest was not uv.lock's).
install_agent() {
    local region="$1"
    local wheelhouse="${WORK}/agent-wheelhouse.zip"
    s3_get "${region}" "${WHEELHOUSE_KEY}" "${wheelhouse}"
    echo "${WHEELHOUSE_SHA256}  ${wheelhouse}" | sha256sum --check --strict --quiet \
        || fail "the agent's wheelhouse s3://${WHEELHOUSE_BUCKET}/${WHEELHOUSE_KEY} does not have the SHA-256 ${WHEELHOUSE_SHA256} synth built; not installing it"
    mkdir -p "${AGENT_HOME}"
    "${AGENT_PYTHON}" -m zipfile -e "${wheelhouse}" "${AGENT_HOME}/wheelhouse"
    local installer=("${AGENT_HOME}/wheelhouse/installer/"pip-*.whl)
    [[ ${#installer[@]} -eq 1 && -f "${installer[0]}" ]] \
        || fail "the agent's wheelhouse holds no single pip wheel under installer/ to install it with"
    "${AGENT_PYTHON}" -m venv --without-pip "${AGENT_HOME}/venv"
    "${AGENT_HOME}/venv/bin/python" "${installer[0]}/pip" install --isolated --disable-pip-version-check \
        --no-input --quiet --no-cache-dir --no-compile --no-index \
        --find-links "${AGENT_HOME}/wheelhouse/wheels" --only-binary :all: \
        --require-hashes --requirement "${AGENT_HOME}/wheelhouse/requirements.txt"
}

# The systemd unit named `$1`, its text read from standard input: written, enabled and started now.
install_unit() {
    local unit="$1"
    mkdir -p "${UNIT_DIR}"
    cat >"${UNIT_DIR}/${unit}"
    systemctl daemon-reload
    systemctl enable --now "${unit}"
}

# The instance role may write this instance's signals and read its runner config, and anyone who
# reaches the metadata service gets its credentials. A job runs as the runner user; only root (the
# agent) may reach the service. A oneshot unit sets the rule at every boot, before the agent starts,
# and the agent's unit requires it: without the rule no agent, so no runner, ever starts. (Containers
# on a bridge network are already cut off by the launch template's hop limit of 1.)
install_imds_guard() {
    mkdir -p "$(dirname "${IMDS_GUARD}")"
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
    install_unit "${IMDS_GUARD_UNIT}" <<UNIT
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
RUNNER_POOL_NOTICE_QUEUE_URL_PREFIX=@NOTICE_QUEUE_URL_PREFIX@
RUNNER_POOL_REGION=${region}
RUNNER_POOL_HEARTBEAT_PERIOD_SECONDS=@HEARTBEAT_PERIOD_SECONDS@
RUNNER_POOL_TERMINATION_GRACE_SECONDS=@TERMINATION_GRACE_SECONDS@
RUNNER_POOL_RETENTION_DAYS=@RETENTION_DAYS@
RUNNER_POOL_LOG_GROUP_NAME=@LOG_GROUP_NAME@
RUNNER_POOL_RUNNER_DIR=${RUNNER_DIR}
RUNNER_POOL_RUNNER_USER=${RUNNER_USER}
RUNNER_POOL_RUNNER_MANIFEST=${RUNNER_MANIFEST}
RUNNER_POOL_JOB_UNIT=runner-pool-job
RUNNER_POOL_CHRONYC=${CHRONYC}
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
    install_unit "${AGENT_UNIT}" <<UNIT
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
# The agent first (SIGTERM), anything of its own left a little later. The runner and its job are a
# sandboxed transient service of their own (runner-pool-job-<id>, agent/sandbox.py), whose slice holds
# everything a job starts, under any uid; the agent stops it and the scrub kills what is left.
KillMode=mixed
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
UNIT
}

# Each part is installed unless it already is at this script's pins; a part installed at other pins
# (an image baked before a deploy changed them) is removed first, so nothing of the old one is left.
install_parts() {
    local region="$1"
    if ! installed_at_pins packages; then
        install_prerequisites
        record_pins packages
    fi
    if ! installed_at_pins runner; then
        rm -rf "${RUNNER_DIR}" "${RUNNER_MANIFEST}" "${BAKED_DIR}/runner"
        install_runner
    fi
    if ! installed_at_pins agent; then
        rm -rf "${AGENT_HOME}" "${BAKED_DIR}/agent"
        install_agent "${region}"
        record_pins agent
    fi
    if ! installed_at_pins runner; then
        record_runner_manifest
        record_pins runner
    fi
}

main() {
    local phase="${1:-boot}"
    [[ "${phase}" == "boot" || "${phase}" == "bake" ]] || fail "unknown phase '${phase}': bake or nothing"
    detect_distribution
    select_agent_python
    WORK="$(mktemp -d)"
    local region
    region="$(imds dynamic/instance-identity/document | sed -n 's/.*"region" *: *"\([^"]*\)".*/\1/p')"
    [[ -n "${region}" ]] || fail "the instance identity document names no region"
    if [[ "${phase}" == "bake" ]]; then
        install_parts "${region}"
        rm -rf "${WORK}"
        return
    fi
    install_parts "${region}"
    # The guard, the agent's settings and its unit are this deploy's, never the image's.
    if [[ "${BLOCK_IMDS_FROM_JOBS}" == "true" ]]; then
        install_imds_guard
    fi
    write_agent_settings "${region}"
    install_service
    rm -rf "${WORK}"
}

main "$@"
