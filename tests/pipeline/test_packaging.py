"""What `pip install` gives a Python user: the wheel built from this tree, as pip builds it.

Its top-level names are the daemons, the domain and the project's own namespace, none generic
enough to shadow another distribution's (`common`, `web` and `kube` did, until issue 37); it holds
every module and data file of those packages, and the daemons start from it alone; every library
the product imports is one of its declared dependencies; and neither the build nor `make test`'s
editable install prints a warning.

The tree is copied first (git's files, as a clean clone has them): setuptools builds in place, so
a build from the working tree would pick up a stale `build/` and race with another test worker.
"""

from __future__ import annotations

import ast
import email
import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from tests.support.base import MUTATION, ROOT

TOP_LEVEL = {"exporter", "status_updater", "topology", "mig_exporter"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST_INFO = f"{PROJECT['name'].replace('-', '_')}-{PROJECT['version']}.dist-info"
# A warning class (BuildBackendWarning, SetuptoolsDeprecationWarning, InformationOnly's
# "Editable installation" block) or a deprecation (pip's DEPRECATION: lines too), in what pip
# relays of the backend. Not pip's own WARNING: lines, which say what its configuration is.
WARNING = re.compile(r"[A-Z]\w*Warning\b|(?i:deprecat)|Editable installation")

pytestmark = pytest.mark.skipif(
    MUTATION, reason="builds in child processes: no mutant is ever seen by it"
)


@dataclass(frozen=True)
class Built:
    source: Path  # the copied tree
    wheel: zipfile.ZipFile = field(repr=False)
    output: str = field(repr=False)  # what pip printed, the backend's lines included

    def names(self) -> list[PurePosixPath]:
        return [PurePosixPath(n) for n in self.wheel.namelist()]

    def metadata(self) -> email.message.Message:
        return email.message_from_bytes(self.wheel.read(f"{DIST_INFO}/METADATA"))


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if WARNING.search(line)]


def pip(*args: str) -> str:
    """pip of the test environment, verbose (the backend's output too); its output if it
    succeeded."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-v", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


def copy_tree(target: Path) -> Path:
    """The files git knows here (committed or not, less the ignored ones): a clean clone's."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("packaging")
    source = copy_tree(work / "source")
    output = pip("wheel", "--no-deps", "--wheel-dir", str(work / "wheel"), str(source))
    (wheel,) = (work / "wheel").glob("*.whl")
    return Built(source, zipfile.ZipFile(wheel), output)


def test_the_wheel_puts_only_the_project_s_names_at_the_top_of_site_packages(built: Built) -> None:
    top = {name.parts[0] for name in built.names()}
    assert top == TOP_LEVEL | {DIST_INFO}
    assert built.metadata()["License-Expression"] == "Apache-2.0"


def test_the_wheel_holds_every_module_and_data_file_of_its_packages(built: Built) -> None:
    """Every file git has under the packages (subpackages such as status_updater.placement, the
    counters files, py.typed), nothing else."""
    expected = {
        PurePosixPath(p.relative_to(built.source).as_posix())
        for package in TOP_LEVEL
        for p in (built.source / package).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".egg-info")
    }
    shipped = {n for n in built.names() if n.parts[0] != DIST_INFO}
    assert shipped == expected
    assert {PurePosixPath(package, "py.typed") for package in TOP_LEVEL} <= shipped


def test_both_daemons_start_from_the_wheel_alone(built: Built, tmp_path: Path) -> None:
    """Every module of the wheel imports from it (not from this tree), and each daemon's
    `--help` answers: what `pip install` and the image run."""
    unpacked = tmp_path / "site-packages"
    built.wheel.extractall(unpacked)
    modules = sorted(
        ".".join(n.with_suffix("").parts).removesuffix(".__init__")
        for n in built.names()
        if n.suffix == ".py" and n.name != "__main__.py"
    )
    # The environment's libraries, but not its .pth files: its editable install of this tree
    # would find what the wheel lacks.
    libraries = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    script = f"""
import importlib, runpy, sys
site = {str(unpacked)!r}
sys.path.insert(0, site)
sys.path.extend({libraries!r})
for name in {modules!r}:
    module = importlib.import_module(name)
    assert module.__file__.startswith(site), (name, module.__file__)
for daemon in ("exporter", "status_updater"):
    sys.argv = [daemon, "--help"]
    try:
        runpy.run_module(daemon, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        assert e.code == 0, (daemon, e.code)
"""
    # -I: neither this tree (the working directory) nor PYTHONPATH on sys.path; -S: no site.
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "usage: python -m exporter" in run.stdout
    assert "usage: python -m status_updater" in run.stdout


def _imported_at_run_time(source: str) -> set[str]:
    """The top-level names a module imports, less those under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def test_every_library_the_product_imports_is_a_declared_dependency(built: Built) -> None:
    """A library only the test extra brings in (prometheus-client was one) would be missing
    wherever the project is installed without it: in the image, for a user."""
    imported: set[str] = set()
    for name in built.names():
        if name.suffix == ".py":
            imported |= _imported_at_run_time(built.wheel.read(str(name)).decode())
    libraries = imported - TOP_LEVEL - set(sys.stdlib_module_names)
    providers = importlib.metadata.packages_distributions()
    needed = {canonical(d) for library in libraries for d in providers.get(library, [library])}
    declared = {
        canonical(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
        for requirement in built.metadata().get_all("Requires-Dist") or []
        if "extra ==" not in requirement
    }
    assert libraries, "no third-party import found: the scan is broken"
    assert needed <= declared, sorted(needed - declared)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_building_prints_no_warning(built: Built) -> None:
    assert warnings_in(built.output) == []


def test_make_test_s_editable_install_prints_no_warning(built: Built, tmp_path: Path) -> None:
    """`pip install -e` as the Makefile's venv target runs it, into an empty environment (the
    dependencies are another matter): no warning, and the packages are this tree's."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    output = pip("--python", str(python), "install", "--no-deps", "-e", str(built.source))
    assert warnings_in(output) == []
    found = subprocess.run(
        [str(python), "-I", "-c", "import importlib.util as u; print(u.find_spec('mig_exporter').origin)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(found) == built.source / "mig_exporter" / "__init__.py"
