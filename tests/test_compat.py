"""The version ranges: pyproject's lower bounds are the pins that the lowest-versions job installs and tests
(.ci/lowest.txt, run by `.ci/compat lowest`), every runtime dependency has a tested lower bound, and torch has no
upper bound (pip keeps a torch already installed, e.g. a CUDA user's newer one)."""

import re

import pytest
from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def lower_bounds(requirements) -> dict:
    """{name: version of its `>=`} for each requirement (None where it has none)."""
    bounds = {}
    for text in requirements:
        req = Requirement(text)
        lows = [spec.version for spec in req.specifier if spec.operator == ">="]
        bounds[canonicalize_name(req.name)] = Version(lows[0]) if len(lows) == 1 else None
    return bounds


def pins() -> dict:
    out = {}
    for line in (REPO_ROOT / ".ci" / "lowest.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", line)
            assert match, f".ci/lowest.txt: not a name==version pin: {line!r}"
            out[canonicalize_name(match[1])] = Version(match[2])
    return out


def test_every_runtime_dependency_has_a_lower_bound_and_it_is_the_tested_pin():
    bounds = lower_bounds(project()["dependencies"])
    assert "torch" in bounds and "transformers" in bounds and len(bounds) >= 10
    assert [name for name, low in bounds.items() if low is None] == []
    pinned = pins()
    assert {name: pinned.get(name) for name in bounds} == bounds


def test_the_test_runner_is_pinned_at_the_dev_extras_bound():
    dev = lower_bounds(r for r in project()["optional-dependencies"]["dev"] if r.startswith("pytest"))
    assert pins()["pytest"] == dev["pytest"]


def test_python_bound_is_the_lowest_python_run():
    """3.11 is the lowest Python the lowest job has run (transformers 5.17 admits 3.10, which has not been run)."""
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet(project()["requires-python"]) == SpecifierSet(">=3.11")


def test_torch_has_no_upper_bound():
    (torch,) = [Requirement(r) for r in project()["dependencies"] if Requirement(r).name == "torch"]
    assert all(spec.operator == ">=" for spec in torch.specifier), str(torch.specifier)


def test_the_installed_versions_are_within_the_ranges():
    """Whatever environment runs the suite (the main venv, the lowest or the newest job) lies within pyproject's
    ranges: a suite that passes on a version outside them tests nothing the ranges promise."""
    from importlib.metadata import version

    outside = []
    for text in project()["dependencies"]:
        req = Requirement(text)
        installed = version(req.name).split("+")[0]  # 2.13.0+cpu -> 2.13.0
        if not req.specifier.contains(installed, prereleases=True):
            outside.append(f"{req.name} {installed} not in {req.specifier}")
    assert outside == []
