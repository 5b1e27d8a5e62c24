"""Fixtures shared by the plugin tests; the stand-ins they use live in module_utils/ beside its tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "module_utils"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "module_utils" / "restart"))
from fake_gateway import FakeGateway
from restart_world import ADMIN_KEY, MODEL
from sglang_fixture import FakeVenv


@pytest.fixture(scope="module")
def fake_venv(tmp_path_factory):
    """A bare venv (no pip) for the tests of one file; they fill its site-packages."""
    return FakeVenv(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def replicas():
    """Two smg replicas (FakeGateway: real HTTP on loopback) that know the restart world's model and admin key."""
    gateways = [FakeGateway("smg", api_key=ADMIN_KEY, model=MODEL).start() for _replica in range(2)]
    yield gateways
    for gateway in gateways:
        gateway.stop()
