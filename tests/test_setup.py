"""setup.sh picks MLX's backend: CUDA 13 or 12 by the NVIDIA driver, else the CPU with OpenBLAS (run with --print)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).parent.parent / "setup.sh"
TOOLS = ("bash", "sh", "dirname", "uname", "sort", "head", "tr", "printf")  # all setup.sh runs before --print exits

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the backend choice is Linux's"),
    pytest.mark.slow,
]


def setup(tmp_path, *args, driver=None, smi_fails=False):
    """Run a copy of setup.sh with --print on a PATH whose only nvidia-smi (if any) prints `driver`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for tool in TOOLS:  # only these: a real nvidia-smi on this machine stays out of sight
        if (found := shutil.which(tool)) and not (bin_ / tool).exists():
            (bin_ / tool).symlink_to(found)
    if driver is not None or smi_fails:
        out, code = (
            ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", 9)
            if smi_fails
            else (driver, 0)
        )
        (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\necho '{out}'\nexit {code}\n")
        (bin_ / "nvidia-smi").chmod(0o755)
    shutil.copy(SETUP, tmp_path / "setup.sh")
    res = subprocess.run(
        [shutil.which("bash"), str(tmp_path / "setup.sh"), *args, "--print"],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_), "HOME": os.environ.get("HOME", "/tmp")},
    )
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / ".venv").exists()  # --print installs nothing
    plan = dict(line.split(": ", 1) if ": " in line else ("pip", line) for line in res.stdout.strip().splitlines())
    return plan, res.stderr


@pytest.mark.parametrize(
    "driver, backend",
    [
        ("580.159.04", "cuda13"),  # the team's H100
        ("580.65.06", "cuda13"),
        ("595.12", "cuda13"),
        ("575.57.08", "cuda12"),
        ("550.54.14", "cuda12"),  # the oldest MLX's CUDA 12 wheel takes
    ],
)
def test_an_nvidia_driver_picks_mlx_cuda_and_no_openblas(tmp_path, driver, backend):
    plan, _ = setup(tmp_path, "--dev", driver=driver)
    assert plan == {"backend": backend, "openblas": "no", "pip": f"pip install -e .[{backend},dev]"}


@pytest.mark.parametrize("driver", ["550.40.07", "535.183.01", "470.256.02"])
def test_a_driver_too_old_for_mlx_cuda_gets_the_cpu_backend_and_says_why(tmp_path, driver):
    plan, err = setup(tmp_path, driver=driver)
    assert plan == {"backend": "cpu", "openblas": "yes", "pip": "pip install -e .[cpu]"}
    assert f"NVIDIA driver {driver} is older" in err


def test_no_gpu_gets_the_cpu_backend_with_openblas_as_ci_does(tmp_path):
    assert setup(tmp_path, "--dev")[0] == {"backend": "cpu", "openblas": "yes", "pip": "pip install -e .[cpu,dev]"}
    assert setup(tmp_path)[0]["pip"] == "pip install -e .[cpu]"
    assert setup(tmp_path, smi_fails=True)[0]["backend"] == "cpu"  # nvidia-smi without a working driver


def test_refs_installs_pytorchs_cpu_wheel_first_and_the_references_without_their_pins(tmp_path):
    import tomllib

    plan, _ = setup(tmp_path, "--dev", "--refs", driver="580.159.04")
    assert plan["pip"] == "pip install -e .[cuda13,dev,refs]"
    assert plan["torch"] == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert plan["no-deps"] == "pip install --no-deps speculators==0.9.0 dflash==0.1.0"
    extras = tomllib.loads((SETUP.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch==2.13.0" in extras["refs"]  # the extra pins the wheel setup.sh puts first


def test_cpu_forces_the_cpu_backend_where_a_gpu_is(tmp_path):
    plan, _ = setup(tmp_path, "--cpu", "--dev", driver="580.159.04")
    assert plan == {"backend": "cpu", "openblas": "yes", "pip": "pip install -e .[cpu,dev]"}


def test_an_unknown_option_is_refused_in_one_line(tmp_path):
    res = subprocess.run(["bash", str(SETUP), "--gpu", "--print"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().startswith("setup: unknown option --gpu")
