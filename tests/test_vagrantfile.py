"""The Vagrantfile is valid for Vagrant and provisions with the same set-up script as the README and CI."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_vagrantfile_validates(tmp_path):
    if shutil.which("vagrant") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("vagrant is not installed; scripts/setup.sh --test installs it")
        pytest.skip("vagrant is not installed (scripts/setup.sh --test installs it)")
    shutil.copy(ROOT / "Vagrantfile", tmp_path / "Vagrantfile")
    env = dict(os.environ, VAGRANT_HOME=str(tmp_path / "vagrant.d"), VAGRANT_CHECKPOINT_DISABLE="1")
    res = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout


def test_vagrantfile_uses_the_setup_script_and_enough_resources():
    text = (ROOT / "Vagrantfile").read_text()
    assert "scripts/setup.sh" in text
    assert re.search(r'config\.vm\.box = "[^"]*ubuntu-2[24]\.04"', text)
    assert int(re.search(r"vb\.memory = (\d+)", text).group(1)) >= 4096
    assert int(re.search(r"vb\.cpus = (\d+)", text).group(1)) >= 2
