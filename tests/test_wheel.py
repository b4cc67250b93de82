"""The wheel is the product: built from the checkout, installed into a fresh virtual environment and run from another
folder, its recipes, calibration text and web page come from what it installed.

The environment is made without pip and without this one's site-packages; the wheel goes in alone (`--no-deps
--no-index`), and a path line then lends it this environment's installed dependencies, offline. A path line in a
`.pth` file adds the folder to `sys.path` without running that folder's own `.pth` files, so the editable install of
this checkout (a finder started from a `.pth`) stays out: the tests check that `mlx_spec` imports from the wheel.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # builds a wheel, starts the installed command

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"mlx_spec": "mlx_spec"}  # checkout folder -> the name it installs as
TOP = ("pyproject.toml", "README.md", "LICENSE")


def _sources() -> list[str]:
    """The files a build reads: the packages' folders as git sees them (tracked and new), and the top files."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *PACKAGES],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    return [*TOP, *(f for f in out.stdout.splitlines() if (REPO / f).is_file())]


class Installed:
    """The wheel installed in a fresh environment: its files, the command, and a run of it from another folder."""

    def __init__(self, root: Path):
        sources = _sources()
        src = root / "src"  # built from a copy: setuptools writes build/ and *.egg-info beside what it builds
        for f in sources:
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
        dist = root / "dist"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
            check=True,
            capture_output=True,
        )
        (self.wheel,) = dist.glob("mlx_spec-*.whl")
        self.sources = [f for f in sources if f not in TOP]
        env = root / "env"
        venv.EnvBuilder(with_pip=False).create(env)
        python = env / "bin" / "python"
        subprocess.run(
            [*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(self.wheel)],
            check=True,
            capture_output=True,
        )
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (Path(site) / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
        self.site, self.command = Path(site), env / "bin" / "mlx-spec"
        self.cwd = root / "elsewhere"  # not the checkout: nothing is found beside the working folder
        self.cwd.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.env.update(MLX_SPEC_HOME=str(root / "home"), HF_HUB_OFFLINE="1")
        self.python = python

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`mlx-spec ARGS` as the installed command, from another folder, its output captured."""
        return subprocess.run(
            [self.command, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_every_file_of_the_packages(installed):
    """Every file of mlx_spec/ (code, recipes, calibration text, suites, the chat, the server, the page and its vendored
    libraries) is in the wheel under its installed name; no test or notebook is."""
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = {PACKAGES[f.split("/")[0]] + f[f.index("/") :] for f in installed.sources}
    assert expected - names == set()
    assert {"mlx_spec/recipes/calibration.txt", "mlx_spec/server/static/vendor/marked.umd.js"} <= names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "docs/"))]


def test_the_packages_import_from_the_environment_not_the_checkout(installed):
    code = "import mlx_spec, mlx_spec.server.app, sys; print(mlx_spec.__file__); print(mlx_spec.server.app.__file__)"
    out = subprocess.run(
        [installed.python, "-c", code], cwd=installed.cwd, env=installed.env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for line in out.stdout.split():
        assert Path(line).is_relative_to(installed.site), line


def test_models_lists_the_recipes_it_installed(installed):
    res = installed.run("models")
    assert res.returncode == 0, res.stderr
    names = [Path(f).stem for f in installed.sources if f.startswith("mlx_spec/recipes/") and f.endswith(".toml")]
    assert names and all(re.search(rf"^{re.escape(n)} ", res.stdout, re.M) for n in names), res.stdout


def test_generate_and_convert_run_from_the_wheel(installed, tmp_path):
    """random:tiny's tokenizer is trained on the installed calibration text; the importance pick ranks on it too."""
    res = installed.run(
        "generate", "--model", "random:tiny", "--draft", "suffix", "--max-tokens", "8", "--verbose", "hi"
    )
    assert res.returncode == 0, res.stderr
    assert "accepted" in res.stderr and "tokens/s" in res.stderr
    out = tmp_path / "draft"
    res = installed.run("convert", "random:tiny", str(out), "--keep-layers", "2", "--layer-pick", "importance")
    assert res.returncode == 0, res.stderr
    assert (out / "config.json").is_file()


def test_serve_answers_and_serves_its_page(installed, tmp_path):
    """The installed server: the model listed, a chat completion, the page and every file it links (vendor too)."""
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                installed.command,
                "serve",
                "--model",
                "random:tiny",
                "--draft",
                "suffix",
                "--port",
                "0",
                "--max-tokens",
                "4",
            ],
            cwd=installed.cwd,
            env=installed.env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once the socket listens
        assert url.startswith("http://127.0.0.1:"), f"stdout began {url!r}\n{log.read_text()}"
        listed = httpx.get(url + "v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in listed] == ["random:tiny"]
        reply = httpx.post(
            url + "v1/chat/completions",
            json={"model": "random:tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4, reply.text
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        linked = re.findall(r'(?:src|href)="/(static/[^"]+)"', page.text)
        assert any(p.startswith("static/vendor/") for p in linked) and any(p.endswith(".js") for p in linked)
        for path in linked:
            assert httpx.get(url + path, timeout=30).status_code == 200, path
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code in (0, 130, -signal.SIGINT)
