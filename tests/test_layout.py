"""The package's layout as a reader meets it: one name per concept."""

import ast
from collections import defaultdict
from pathlib import Path

import mlx_spec

PACKAGE = Path(mlx_spec.__file__).parent


def class_homes() -> dict[str, set[str]]:
    """Each class name defined in the package and the modules that define it."""
    homes: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                homes[node.name].add(module)
    return homes


def test_no_class_name_is_defined_in_two_modules():
    twice = {name: sorted(modules) for name, modules in class_homes().items() if len(modules) > 1}
    assert not twice, f"class names defined in more than one module: {twice}"


def test_the_walk_finds_a_class_where_it_is_defined():
    assert class_homes()["Engine"] == {"mlx_spec.gen.engine"}
