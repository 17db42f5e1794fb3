"""Every ```python block of the README runs (blocks marked ```python notest are fragments)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(code: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"README.md block in {tmp_path}", "exec"), {"__name__": "__readme__"})


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3
