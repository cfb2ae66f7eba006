"""Every `tf.function` the product builds is traced without autograph (see `globaldl.step`).

Autograph rewrote each function the training step calls, at every process start: seconds on a
small device, for control flow that is written with TensorFlow's own ops anyway. A new
`tf.function` that leaves it on (or relies on it) fails here, naming the place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("globaldl", "compression", "pipelines", "monitoring")


def _tf_function_sites(tree: ast.AST) -> list[tuple[int, bool]]:
    """(line, autograph turned off) of every `tf.function` call or bare decorator in a module."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "tf.function":
            off = any(
                keyword.arg == "autograph"
                and isinstance(keyword.value, ast.Constant)
                and keyword.value.value is False
                for keyword in node.keywords
            )
            sites.append((node.lineno, off))
        for decorator in getattr(node, "decorator_list", []):
            if not isinstance(decorator, ast.Call) and ast.unparse(decorator) == "tf.function":
                sites.append((decorator.lineno, False))
    return sites


def test_the_scan_finds_decorators_and_calls_with_and_without_autograph() -> None:
    source = (
        "@tf.function\ndef a(): pass\n"
        "@tf.function(autograph=False)\ndef b(): pass\n"
        "c = tf.function(lambda: 1)\n"
        "d = tf.function(lambda: 1, autograph=False)\n"
    )
    assert sorted(_tf_function_sites(ast.parse(source))) == [
        (1, False),
        (3, True),
        (5, False),
        (6, True),
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_tf_function_turns_autograph_off(package: str) -> None:
    found, on = 0, []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, off in _tf_function_sites(ast.parse(path.read_text())):
            found += 1
            if not off:
                on.append(f"{path.relative_to(REPO)}:{line}")
    assert not on, f"tf.function with autograph on (add autograph=False): {on}"
    if package == "globaldl":
        assert found >= 10, found
