"""requirements.lock is complete and is what is installed: regenerate it with `make lock`."""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def requirements(name: str) -> list[Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    return [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]


def locked() -> dict[str, tuple[str, Marker | None]]:
    out = {}
    for req in requirements("requirements.lock"):
        (spec,) = req.specifier
        assert spec.operator == "==", f"requirements.lock: {req} is not pinned"
        out[canonicalize_name(req.name)] = (spec.version, req.marker)
    return out


def test_every_requirement_is_locked_at_its_pin():
    lock = locked()
    for name in ("requirements.txt", "requirements-dev.txt"):
        for req in requirements(name):
            key = canonicalize_name(req.name)
            assert key in lock, f"{name}: {req.name} is missing from requirements.lock (run `make lock`)"
            assert req.specifier.contains(lock[key][0]), (
                f"{name} asks {req}, requirements.lock has {lock[key][0]} (run `make lock`)"
            )


def test_installed_packages_are_the_locked_versions():
    wrong = {}
    for name, (pinned, marker) in locked().items():
        if marker is not None and not marker.evaluate():
            continue  # another platform's package
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            wrong[name] = f"locked {pinned}, installed {installed}"
    assert not wrong, f"the venv differs from requirements.lock (rebuild it, or `make lock` if intended): {wrong}"
