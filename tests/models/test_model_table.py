"""docs/cluster.md's "What fits where" table is what scripts/model_table.py computes, and its prices
agree with blocks of the same shapes loaded for real."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("model_table", REPO / "scripts/model_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_scripts_output() -> None:
    readme = (REPO / "docs" / "cluster.md").read_text()
    start = readme.index("<!-- model-table:start -->\n") + len("<!-- model-table:start -->\n")
    end = readme.index("<!-- model-table:end -->")
    assert readme[start:end].strip() == _script().table().strip()


def test_llama_8b_numbers_by_hand() -> None:
    """One row checked against arithmetic: Llama 3.1 8B in bfloat16 is 8.03e9 parameters."""
    row = _script().row(*next(m for m in _script().MODELS if m[0] == "Llama-3.1-8B"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # q, o [4096, 4096]; k, v [1024, 4096]; gate, up, down 4096 x 14336; two norms
    block = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * block + 2 * 128256 * 4096 + 4096  # + embeddings, untied head, final norm
    assert params == 8_030_261_248
    assert cells[3] == f"{block * 2 / 2**20:.0f} MiB / {params * 2 / 2**30:.1f} GiB / 2"
