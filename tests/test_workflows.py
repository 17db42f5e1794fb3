"""The GitHub workflows parse and describe the promised matrices (`./dev lint` also checks them
against the workflow JSON schema with check-jsonschema)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in job["steps"] if str(step.get("uses", "")).startswith(action)]


def test_ci_lints_tests_rust_and_runs_pytest_on_three_pythons_and_three_systems():
    ci = load("ci.yml")
    lint = ci["jobs"]["lint"]
    commands = [step.get("run", "") for step in lint["steps"]]
    assert "./dev lint" in commands and "./dev cargo-test" in commands
    matrix = ci["jobs"]["test"]["strategy"]["matrix"]
    assert matrix["os"] == ["ubuntu-latest", "macos-latest", "windows-latest"]
    assert matrix["python"] == ["3.12", "3.13", "3.14"]
    assert any("pytest" in step.get("run", "") for step in ci["jobs"]["test"]["steps"])


def test_wheels_cover_every_platform_test_the_wheels_and_publish_on_tags():
    wheels = load("wheels.yml")
    jobs = wheels["jobs"]
    targets = {
        (e["platform"], e["archs"], e["build"].split()[0])
        for e in jobs["wheels"]["strategy"]["matrix"]["include"]
    }
    assert targets == {
        ("linux", "x86_64", "cp312-manylinux_*"),
        ("linux", "aarch64", "cp312-manylinux_*"),
        ("linux", "x86_64", "cp312-musllinux_*"),
        ("linux", "aarch64", "cp312-musllinux_*"),
        ("macos", "x86_64", "cp312-*"),
        ("macos", "arm64", "cp312-*"),
        ("windows", "AMD64", "cp312-*"),
    }
    assert steps_using(jobs["wheels"], "pypa/cibuildwheel@")
    assert "maturin sdist" in "".join(step.get("run", "") for step in jobs["sdist"]["steps"])
    publish = jobs["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert "startsWith(github.ref, 'refs/tags/v')" in publish["if"]
    assert set(publish["needs"]) == {"wheels", "sdist"}
    assert steps_using(publish, "pypa/gh-action-pypi-publish@")
    # "on" is YAML 1.1's True to PyYAML.
    triggers = wheels.get("on", wheels.get(True))
    assert triggers["push"]["tags"] == ["v*"]


def test_cibuildwheel_tests_every_wheel_with_the_smoke_script():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    cibw = config["tool"]["cibuildwheel"]
    assert cibw["build"] == ["cp312-*", "cp313-*", "cp314-*"]
    assert cibw["test-command"] == "python {project}/scripts/wheel_smoke.py"
    assert (ROOT / "scripts" / "wheel_smoke.py").is_file()
    assert cibw["manylinux-x86_64-image"] == cibw["manylinux-aarch64-image"] == "manylinux2014"
