"""docker/constraints.txt pins every image's packages: the pins must satisfy each other's requirements.

A pin set that contradicts itself fails only when an image is built (pip cannot resolve `-c constraints.txt`),
which no test here does: e.g. python-dateutil==4.0.0 beside botocore, which needs python-dateutil<3.
Each pinned package whose pinned version is installed here is checked with its own metadata.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

CONSTRAINTS = Path(__file__).resolve().parents[2] / "docker" / "constraints.txt"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def conflicts(pins: dict[str, Version]) -> list[str]:
    """Requirements of installed pinned packages that another pin does not satisfy."""
    found = []
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version.split("+")[0]) != version:
            continue  # another version is installed here: its metadata says nothing about the pinned one
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            pinned = pins.get(canonicalize_name(req.name))
            # The pins drop local labels (torch==2.13.0 for 2.13.0+cpu; the CPU image names +cpu itself).
            public = SpecifierSet(",".join(str(s).split("+")[0] for s in req.specifier))
            if pinned is not None and not public.contains(pinned, prereleases=True):
                found.append(f"{name}=={version} needs {req}, pinned {req.name}=={pinned}")
    return found


def test_pins_satisfy_each_other() -> None:
    assert conflicts(_pins()) == []


def test_a_contradicting_pin_is_found() -> None:
    pins = _pins()
    botocore = metadata.distribution("botocore")
    pins[canonicalize_name("botocore")] = Version(botocore.version)
    pins[canonicalize_name("python-dateutil")] = Version("4.0.0")  # botocore requires python-dateutil<3
    assert any(c.startswith("botocore==") and "python-dateutil" in c for c in conflicts(pins))
