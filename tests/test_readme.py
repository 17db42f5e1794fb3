"""Every code block of the README runs (or, for set-up lines, is checked).

- ```python blocks run in-process, in a fresh namespace and a temporary directory, with the test
  session's SeaweedFS in the standard AWS variables (AWS_ENDPOINT_URL, AWS_REGION,
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as a user's shell would provide them; variables a
  block sets are undone after it.
- ```bash blocks of command-line usage run under ``bash -euo pipefail`` in a temporary directory,
  with the same variables and this environment's ``syvain-data`` and ``python`` first on PATH.
- ```bash blocks made only of ``./dev ...`` and ``pip install ...`` lines are not run here:
  ``./dev test`` is what runs this file (running it again would recurse, and ``./dev demo`` and
  ``./dev setup`` rebuild the environment under the running tests), and ``pip install`` would
  change this environment or need the package on PyPI. They are checked instead: every ``./dev``
  subcommand exists in ``dev``, and every ``pip install`` names this project and extras that
  ``pyproject.toml`` defines. (``./dev demo``'s job itself runs in tests/cli/test_demo.py.)
- Any other language is an error, so no block escapes these checks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = [
    (language, info.strip(), code)
    for language, info, code in re.findall(
        r"^```(\w*)([^\n]*)\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M
    )
]
PYTHON = [code for language, _, code in BLOCKS if language == "python"]
BASH = [code for language, _, code in BLOCKS if language == "bash"]
SETUP_PREFIXES = ("./dev ", "pip install ")


def is_setup_block(code: str) -> bool:
    commands = [line for line in code.splitlines() if line.strip() and not line.startswith("#")]
    return all(line.startswith(SETUP_PREFIXES) for line in commands)


RUN_BASH = [code for code in BASH if not is_setup_block(code)]
SETUP_BASH = [code for code in BASH if is_setup_block(code)]


@pytest.fixture
def aws_env(seaweed, monkeypatch) -> dict[str, str]:
    """The session's S3 server in the standard AWS variables (for this process and children)."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def test_every_block_is_python_or_bash():
    assert {language for language, _, _ in BLOCKS} <= {"python", "bash"}
    assert all(info == "" for _, info, _ in BLOCKS), "no block may opt out (e.g. `notest`)"
    assert len(PYTHON) >= 8 and len(RUN_BASH) >= 2 and len(SETUP_BASH) == 2


@pytest.fixture(scope="module")
def representation_publication(seaweed) -> tuple[str, str]:
    """A small OLMo 3 representation publication in the session's SeaweedFS (its manifest URI
    and digest), for the README's representation example."""
    from representation_fixture import PublicationBuilder
    from syvain_training_data.storage import StorageConfig

    config = StorageConfig.create(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    published = PublicationBuilder(seed=3).publish(config)
    return published.manifest_uri, published.manifest_sha256


@pytest.mark.parametrize("code", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_python_block_runs(code: str, tmp_path, monkeypatch, aws_env, request) -> None:
    monkeypatch.chdir(tmp_path)
    if "SYVAIN_REPRESENTATION_MANIFEST" in code:
        uri, digest = request.getfixturevalue("representation_publication")
        monkeypatch.setenv("SYVAIN_REPRESENTATION_MANIFEST", uri)
        monkeypatch.setenv("SYVAIN_REPRESENTATION_SHA256", digest)
    saved = dict(os.environ)
    try:
        exec(compile(code, f"README.md block in {tmp_path}", "exec"), {"__name__": "__readme__"})
    finally:
        # A block may set variables (the credentials example points botocore at a file of its
        # own): they end with it.
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("code", RUN_BASH, ids=[f"bash-{i}" for i in range(len(RUN_BASH))])
def test_command_line_block_runs(code: str, tmp_path, aws_env) -> None:
    env = {**aws_env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{aws_env['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{code}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.strip(), "the block printed nothing"


def dev_subcommands() -> set[str]:
    script = (ROOT / "dev").read_text(encoding="utf-8")
    cases = script[script.index('case "${1:-}" in') :]
    return set(re.findall(r"^  ([a-z-]+)\)", cases, flags=re.M))


def test_dev_commands_exist():
    lines = [line for code in SETUP_BASH for line in code.splitlines() if line.startswith("./dev ")]
    assert lines
    for line in lines:
        assert shlex.split(line, comments=True)[1] in dev_subcommands(), line


def test_pip_install_lines_name_this_project_and_its_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = set(project["optional-dependencies"])
    lines = [line for code in SETUP_BASH for line in code.splitlines() if line.startswith("pip ")]
    assert lines
    for line in lines:
        requirement = shlex.split(line, comments=True)[2]
        name, _, rest = requirement.partition("[")
        assert name == project["name"], line
        assert set(filter(None, rest.rstrip("]").split(","))) <= extras, line
