"""Every function the synthesized template names imports from what would be deployed, and only that.

The dev virtualenv holds everything the tests need (moto, its server, the CDK); a Lambda holds its code
asset, its layers and the runtime's standard library. So each function's handler is imported here in
a fresh interpreter started with `-S -I` (no site-packages, no PYTHONPATH, no user site), whose
`sys.path` holds only that function's code asset and its layers' `python/` directories, as the Lambda
Python runtime puts them (https://docs.aws.amazon.com/lambda/latest/dg/packaging-layers.html#packaging-layers-paths:
"/opt/python" for a Python layer), and whose environment is the function's own from the template plus
the variables the runtime defines
(https://docs.aws.amazon.com/lambda/latest/dg/configuration-envvars.html#configuration-envvars-runtime).
The layer is built from uv.lock's pins by the stack's own builder, for this machine's Python and
platform instead of the Lambda's: the same requirements, wheels this interpreter can load.

The Lambda runtime also puts its own boto3 on the path; we do not count on it (the layer pins boto3), so
it is absent here too. Caught on f478fe5: every handler failed with `ModuleNotFoundError: No module named
'aws_xray_sdk'` (Powertools' Tracer needs its `[tracer]` extra, which no runtime dependency asked for).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from infra.app import CONFIG_CONTEXT_KEY, STACK_ID, build_app, project_context
from infra.dependency_layer import dependency_layer, host_target
from tests.infra.synthesis import DEPLOYABLE

pytestmark = pytest.mark.slow

IMPORT = """
import importlib, json, sys
module, _, name = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module), name)
assert callable(handler), f"{sys.argv[1]} is not callable"
outside = sorted(
    m.__name__ for m in list(sys.modules.values())
    if getattr(m, "__file__", None) and not any(m.__file__.startswith(p) for p in sys.argv[2:])
    and "site-packages" in m.__file__
)
print(json.dumps(outside))
"""
"""Imports the handler named in argv[1]; prints any module loaded from a site-packages outside argv[2:]."""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A synthesized assembly whose layer is the real locked dependencies, built for this machine."""
    layer = dependency_layer(target=host_target())
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = project_context()
    context[CONFIG_CONTEXT_KEY] = {**context.get(CONFIG_CONTEXT_KEY, {}), **DEPLOYABLE}
    build_app(context, outdir=str(outdir), layer=layer).synth()
    template = json.loads((outdir / f"{STACK_ID}.template.json").read_text())
    return outdir, template["Resources"]


def _functions(resources: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        logical_id: resource
        for logical_id, resource in resources.items()
        if resource["Type"] == "AWS::Lambda::Function"
        and "Handler" in resource["Properties"]
        # CDK's own singleton functions (custom resources, log retention) run Node.js, not our code
        and resource["Properties"].get("Runtime", "").startswith("python")
    }


def _asset(outdir: Path, code: dict[str, Any]) -> Path:
    """The directory a Code/Content's S3 object is zipped from, as the assembly's asset manifest (what
    `cdk deploy` uploads) names it."""
    manifest = json.loads((outdir / f"{STACK_ID}.assets.json").read_text())
    source = manifest["files"][code["S3Key"].removesuffix(".zip")]["source"]
    assert source["packaging"] == "zip", source
    path: str = source["path"]
    return outdir / path


def _value(value: Any) -> str:
    """An environment value as Lambda would see it: CloudFormation's intrinsics become a stand-in string."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return f"resolved-{value['Ref']}"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        logical_id, attribute = value["Fn::GetAtt"]
        return f"arn:aws:lambda:us-east-1:123456789012:resolved:{logical_id}-{attribute}"
    if isinstance(value, dict) and "Fn::Join" in value:
        separator: str
        separator, parts = value["Fn::Join"]
        return separator.join(_value(part) for part in parts)
    return json.dumps(value)


def _import(outdir: Path, resources: dict[str, Any], logical_id: str) -> tuple[str, str]:
    function = resources[logical_id]
    properties = function["Properties"]
    code = (
        Path(properties["Code"]["S3Key"])
        if "Local" in properties["Code"]
        else _asset(outdir, properties["Code"])
    )
    layers = [
        _asset(outdir, resources[layer["Ref"]]["Properties"]["Content"]) / "python"
        for layer in properties.get("Layers", [])
    ]
    environment = {
        name: _value(value) for name, value in properties.get("Environment", {}).get("Variables", {}).items()
    }
    environment |= {
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_LAMBDA_FUNCTION_NAME": logical_id,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(properties.get("MemorySize", 128)),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{properties['Runtime']}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "LAMBDA_TASK_ROOT": str(code),
        "_HANDLER": properties["Handler"],
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
    }
    path = [str(code), *map(str, layers)]
    program = f"import sys; sys.path[:0] = {path!r}\n{IMPORT}"
    done = subprocess.run(  # noqa: S603 - this interpreter, our own program
        [sys.executable, "-S", "-I", "-c", program, properties["Handler"], *path],
        capture_output=True,
        text=True,
        env=environment,
        cwd=code,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        return logical_id, f"{properties['Handler']}: {done.stderr.strip().splitlines()[-1]}"
    outside = json.loads(done.stdout)
    return logical_id, f"{properties['Handler']}: loaded from outside the asset: {outside}" if outside else ""


def test_every_deployed_handler_imports_from_its_code_asset_and_layers_alone(
    deployed: tuple[Path, dict[str, Any]],
) -> None:
    # Given the synthesized stack, its layer built from uv.lock's runtime pins
    outdir, resources = deployed
    functions = _functions(resources)
    assert len(functions) >= 10, sorted(functions)

    # When each function's handler is imported with only its code asset and layers on sys.path
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = {
            logical_id: failure
            for logical_id, failure in pool.map(lambda f: _import(outdir, resources, f), functions)
            if failure
        }

    # Then every one imports, and nothing came from anywhere else
    assert not failures, json.dumps(failures, indent=1)


def test_the_import_check_fails_a_handler_whose_dependency_the_layer_lacks(
    deployed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    # Given a function whose code asset imports a module only the dev virtualenv has (the shape of
    # f478fe5's aws_xray_sdk, which only moto[server] brought)
    outdir, resources = deployed
    logical_id = next(iter(_functions(resources)))
    broken = tmp_path / "asset"
    broken.mkdir()
    (broken / "needs_more.py").write_text("import moto  # a dev dependency\n\nhandler = print\n")
    function = json.loads(json.dumps(resources[logical_id]))
    function["Properties"]["Code"] = {"Local": True, "S3Key": str(broken)}
    function["Properties"]["Handler"] = "needs_more.handler"

    # When it is imported the same way
    _, failure = _import(outdir, {**resources, logical_id: function}, logical_id)

    # Then the check names the missing module
    assert "No module named 'moto'" in failure


TIME_ZONES = """
import sys, zoneinfo
zoneinfo.reset_tzpath([])  # no system tz database, as Lambda's AL2023 images do not promise one
from runner_pool.domain.config import load_config
schedule = {"time_zone": "Europe/Berlin", "windows": [{"start": "09:00", "end": "18:00", "hot": 2}]}
minimum = load_config({"warm_pool_minimum": {"large": schedule}}).warm_pool_minimum["large"]
print(minimum.in_force(1_800_000_000.0), sys.modules["tzdata"].__file__)
"""
"""Validates a warm-minimum schedule in Berlin and asks for the minimum at Friday 09:00 there (08:00 UTC)."""


def test_a_deployed_function_reads_time_zones_from_its_layer_without_the_systems_database(
    deployed: tuple[Path, dict[str, Any]],
) -> None:
    # Given the refresh function's code asset and layers, and no system tz database (aws-lambda-dotnet#1620:
    # provided.al2023 shipped none; Python's zoneinfo then needs the `tzdata` package)
    outdir, resources = deployed
    (function,) = (
        f
        for f in _functions(resources).values()
        if f["Properties"]["Handler"] == "runner_pool.handlers.refresh.refresh"
    )
    properties = function["Properties"]
    path = [
        str(_asset(outdir, properties["Code"])),
        *(
            str(_asset(outdir, resources[layer["Ref"]]["Properties"]["Content"]) / "python")
            for layer in properties["Layers"]
        ),
    ]
    # When a schedule in Europe/Berlin is validated and asked for its minimum there
    done = subprocess.run(  # noqa: S603 - this interpreter, our own program
        [sys.executable, "-S", "-I", "-c", f"import sys; sys.path[:0] = {path!r}\n{TIME_ZONES}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then the window's minimum is in force, from a tz database the layer carries
    assert done.returncode == 0, done.stderr
    in_force, tzdata = done.stdout.split()
    assert in_force == "2"
    assert tzdata.startswith(path[1]), tzdata
