"""The README says what is true: its two commands exist, and it documents every environment
variable that ftlab (or its test setup) reads."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a string constant of this form in the sources is the name of an environment variable
ENV_NAME = re.compile(r"(FTLAB|TRITON|CUDA|ROCM|HYPOTHESIS|OMP)_[A-Z0-9_]+|CXX")


def env_names_in_sources() -> set[str]:
    names = set()
    for path in [*(ROOT / "ftlab").rglob("*.py"), ROOT / "tests" / "conftest.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and ENV_NAME.fullmatch(node.value)
            ):
                names.add(node.value)
    return names


def test_readme_documents_every_environment_variable():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    names = env_names_in_sources()
    assert {"FTLAB_BACKEND", "TRITON_INTERPRET", "FTLAB_CACHE_DIR", "CUDA_HOME"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"README.md, 'Environment variables': add {missing}"


def test_readme_commands_are_make_targets():
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in head
        assert re.search(rf"^{target}:", makefile, re.M), target
