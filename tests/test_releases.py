"""The supported megatron-core releases are declared once (megatron_neobert/install/releases.py): what refuses,
pins, installs or names a release (megatron_core_compat, te_support, setup.py, the Dockerfile, .ci/run, README's
supported-stack line) reads that record or agrees with it here, so that a release bump cannot leave one behind."""

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet

from megatron_neobert import megatron_core_compat
from megatron_neobert.install import te_support
from megatron_neobert.install.releases import RELEASES
from setup_py import setup_py

REPO = Path(__file__).resolve().parents[1]
SERIES = {release.series for release in RELEASES}
VERSIONS = {release.version for release in RELEASES}
MINORS = range(10, 30)  # the 0.x series a pin could let in or keep out


def python_range(release) -> str:
    """"3.12", or "3.10-3.12": the CPython a release runs on, as README writes it."""
    low, high = (".".join(map(str, version)) for version in release.python)
    return low if low == high else f"{low}-{high}"


def test_the_runtime_and_the_container_choice_read_the_record():
    assert set(megatron_core_compat.SUPPORTED) == SERIES
    assert megatron_core_compat.RELEASE in {tuple(map(int, s.split("."))) for s in SERIES}  # this install's
    assert te_support.RELEASES is RELEASES
    for release in RELEASES:
        assert release.te_api.is_file(), f"{release.te_api}: python -m {te_support.__name__} --write"


def test_setup_py_admits_the_supported_series_alone():
    setup = setup_py()["setup"]
    (pin,) = [r for r in setup["install_requires"] if r.startswith("megatron-core")]
    specifier = SpecifierSet(pin[len("megatron-core"):])
    admitted = {f"0.{minor}" for minor in MINORS if f"0.{minor}.0" in specifier}
    assert admitted == SERIES, pin
    assert all(version in specifier for version in VERSIONS), pin
    oldest = min(release.python[0] for release in RELEASES)
    assert setup["python_requires"] == ">={}.{}".format(*oldest)


def test_the_dockerfile_names_the_supported_releases_alone():
    named = set(re.findall(r"\b0\.\d+\.\d+\b", (REPO / "Dockerfile").read_text()))
    assert named == VERSIONS
    assert "python -m megatron_neobert.install.te_support" in (REPO / "Dockerfile").read_text()


def test_ci_installs_each_release_with_its_torch():
    ci = (REPO / ".ci/run").read_text()
    ci_torch = {release.version: release.ci_torch for release in RELEASES}
    assert set(re.findall(r"torch==(\S+)", ci)) == set(ci_torch.values())
    assert set(re.findall(r"megatron-core[ =]=?(0\.\d+\.\d+)", ci)) == VERSIONS
    # lane 2 installs a release with its torch, then checks the pair pip kept
    for version, torch in re.findall(r"pip install torch==(\S+) megatron-core==(\S+)", ci):
        assert ci_torch[torch] == version
    for version, torch in re.findall(r'"megatron-core": "(\S+)", "torch": "(\S+)"', ci):
        assert ci_torch[version] == torch


def test_readmes_supported_stacks_are_the_records():
    readme = " ".join((REPO / "README.md").read_text().split())
    (stacks,) = re.findall(r"Supported stacks: .*?\(CI: [^)]*\)", readme)
    for release in RELEASES:
        assert f"**{release.series}** on CPython {python_range(release)}" in stacks, stacks
        assert f"{release.ci_torch} with {release.series}" in stacks, stacks
    low, high = (int(f(SERIES, key=lambda s: int(s.split(".")[1])).split(".")[1]) for f in (min, max))
    refused = [f"0.{minor}" for minor in range(low, high) if f"0.{minor}" not in SERIES]
    assert f"{' and '.join(refused)} are refused at import" in stacks, stacks
