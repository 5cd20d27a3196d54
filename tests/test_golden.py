"""Fixed `sim` and `compare` runs give the JSON kept in tests/golden/, wall-clock fields excepted
(`tests/golden_runs.py`): what a refactoring must leave unchanged, to the byte."""
from __future__ import annotations

import json

import pytest

from tests.golden_runs import GOLDEN, runs


@pytest.fixture(scope="module")
def computed():
    return runs()


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_a_fixed_run_gives_the_golden_json(name, computed):
    want = (GOLDEN / f"{name}.json").read_text()
    got = json.dumps(computed[name], indent=1, sort_keys=True) + "\n"
    assert got == want, f"{name}: differs from tests/golden/{name}.json (python -m tests.golden_runs --write " \
                        "if the change is meant to change results)"


def test_every_run_has_its_golden_file(computed):
    assert sorted(computed) == sorted(p.stem for p in GOLDEN.glob("*.json"))
