"""Architecture boundaries: no service imports another, and only the trainer may import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("state-collector", "graph-builder", "inference", "reward-calculator", "adaptive-engine", "trainer")


def module_of(service: str) -> str:
    return "agmarl_" + service.replace("-", "_")


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "trainer"])
def test_service_runs_without_torch(service):
    code = (f"import sys, runpy; import {module_of(service)}.app; "
            "import agmarl_common.core.cluster.filters, agmarl_common.core.policies.registry as r; r.policy_names(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{service} imported torch\n{out.stderr}"


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_imports_another(service):
    own = module_of(service)
    others = {module_of(s) for s in SERVICES} - {own}
    for path in (ROOT / "services" / service).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in others, f"{path} imports {name}"
