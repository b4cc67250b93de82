"""Which device ran: the backend, the GPU's name and the NVIDIA driver, on MLX faked onto CUDA and Metal."""

import mlx.core as mx
import pytest

from mlx_spec import blas, device
from mlx_spec.bench.common import machine_info, machine_line

H100 = "NVIDIA H100 80GB HBM3"


def fake_nvidia_smi(tmp_path, monkeypatch, stdout: str, code: int = 0):
    """Put an `nvidia-smi` on PATH that prints `stdout` and exits with `code`."""
    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{stdout}'\nexit {code}\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    device.nvidia_driver.cache_clear()


@pytest.fixture
def gpu(monkeypatch):
    """MLX's default device faked to a GPU named `H100` (the device's name is what MLX's device_info says)."""
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mx, "device_info", lambda d=None: {"device_name": H100, "architecture": "sm_90"})
    yield
    device.nvidia_driver.cache_clear()


def test_cuda_names_the_gpu_and_the_driver(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    fake_nvidia_smi(tmp_path, monkeypatch, "580.159.04")
    assert device.info() == device.Device("gpu", "cuda", H100, driver="580.159.04")
    assert device.describe() == f"gpu (CUDA, {H100}, driver 580.159.04)"


def test_a_broken_nvidia_smi_leaves_the_driver_out(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA-SMI has failed because it couldn't communicate with the driver", 9)
    assert device.describe() == f"gpu (CUDA, {H100})"


def test_metal_names_the_chip(gpu, monkeypatch):
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    assert device.describe() == f"gpu (Metal, {H100})"


def test_the_cpu_backend_names_the_cpu_and_its_blas(monkeypatch):
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu))
    d = device.info()
    assert (d.kind, d.backend, d.driver) == ("cpu", "cpu", None)
    assert d.name == mx.device_info(mx.cpu)["device_name"] and d.name
    monkeypatch.setattr(blas, "status", "openblas")
    assert device.describe() in (f"cpu ({d.name}, OpenBLAS)", f"cpu ({d.name}, Accelerate)")
    monkeypatch.setattr(blas, "status", "none")
    assert device.describe() in (f"cpu ({d.name}, reference BLAS)", f"cpu ({d.name}, Accelerate)")


def test_bench_records_and_their_header_line_say_which_gpu_ran(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    fake_nvidia_smi(tmp_path, monkeypatch, "580.159.04")
    m = machine_info()
    assert (m["mlx_backend"], m["gpu"], m["gpu_driver"]) == ("cuda", H100, "580.159.04")
    assert f"(Device(gpu, 0), CUDA {H100}, driver 580.159.04)" in machine_line(m)
    old = {k: v for k, v in m.items() if k not in ("mlx_backend", "gpu", "gpu_driver")}  # a record from before
    assert "(Device(gpu, 0))" in machine_line(old)


def test_bench_records_on_the_cpu_backend_name_no_gpu(monkeypatch):
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu))
    m = machine_info()
    assert (m["mlx_backend"], m["gpu"], m["gpu_driver"]) == ("cpu", None, None)
    assert "(Device(cpu, 0))" in machine_line(m)


def test_the_blas_hint_is_for_the_cpu_backend_only(gpu, monkeypatch):
    monkeypatch.setattr(blas, "status", "none")
    assert blas.hint() is None  # a CUDA box needs no OpenBLAS: setup.sh does not install it
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu))
    assert "libopenblas" in blas.hint()
