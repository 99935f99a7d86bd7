"""The seam holds: no core module imports a concrete kernel family, and no module outside
families/ names the GEMM family in its code (docstrings and comments may, as documentation;
registration -- families/__init__.py -- is inside families/)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import tunedb

ROOT = Path(tunedb.__file__).parent
CONCRETE = re.compile(r"^tunedb\.families\.(?!contract$)[a-z_]+")
NAMES_GEMM = re.compile(r"\bgemm\b|\bgemm_", re.IGNORECASE)


def core_modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "families" not in p.relative_to(ROOT).parts)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def test_no_core_module_imports_a_concrete_family():
    offenders = []
    for path in core_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            hits = [t for t in targets if CONCRETE.match(t) and not t.startswith("tunedb.families.contract")]
            if hits:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {hits[0]}")
    assert not offenders, "core modules import a concrete family:\n" + "\n".join(offenders)


def test_the_scan_catches_an_import_of_a_family(tmp_path):
    tree = ast.parse("from tunedb.families.gemm import configs\nfrom tunedb.families.contract import hook\n")
    hits = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and CONCRETE.match(n.module)
            and not n.module.startswith("tunedb.families.contract")]
    assert hits == ["tunedb.families.gemm"]


def gemm_mentions(path: Path) -> list[str]:
    return _mentions(path, ROOT)


def _mentions(path: Path, root: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias):
            text = node.name
        if text and NAMES_GEMM.search(text):
            found.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}: {text[:60]!r}")
    return found


def test_no_module_outside_families_names_gemm():
    offenders = {}
    for path in core_modules():
        hits = gemm_mentions(path)
        if hits:
            offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, "modules outside families/ name gemm:\n" + "\n".join(
        h for hits in offenders.values() for h in hits)


def test_the_name_scan_sees_code_but_not_documentation(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text('"""Docs may say gemm."""\n# so may comments: gemm\nFAMILY = "gemm"\n')
    assert [h.split(": ", 1)[1] for h in _mentions(path, tmp_path)] == ["'gemm'"]
