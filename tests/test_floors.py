"""The floors pyproject.toml declares are the versions `make floors` installs (issue 41)."""
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:              # Python < 3.11: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def declared_floors() -> dict:
    """{name: floor} for every dependency in pyproject.toml, the dev extras included."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floors = {}
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(line)
        lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
        floors[canonicalize_name(req.name)] = lows[0] if len(lows) == 1 else None
    return floors


def pinned_floors() -> dict:
    """{name: version} from constraints/floors.txt."""
    pins = {}
    for line in (ROOT / "constraints" / "floors.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_dependency_declares_one_floor():
    missing = sorted(name for name, floor in declared_floors().items() if floor is None)
    assert not missing, f"no single '>=' floor in pyproject.toml: {missing}"


def test_the_constraints_pin_exactly_the_declared_floors():
    assert pinned_floors() == declared_floors()
