"""Labs started side by side (e2e and molecule workers) share the rootfs cache and the simgpu build."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB_DIR))

from labctl import image, payload  # noqa: E402

LABS = 3


class Overlap:
    """A stand-in for a long build step that records how many ran at the same time."""

    def __init__(self):
        self.guard = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls = 0

    def __enter__(self):
        with self.guard:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        time.sleep(0.2)

    def __exit__(self, *exc):
        with self.guard:
            self.running -= 1


def side_by_side(function) -> list:
    results, errors = [], []

    def one():
        try:
            results.append(function())
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, name=f"lab{index}") for index in range(LABS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results


def test_labs_started_together_link_the_simulated_driver_one_at_a_time(tmp_path, monkeypatch):
    # Two makes linking the same nvidia-smi let a lab copy a half-written binary into its hosts.
    overlap = Overlap()

    def make(args, **_kwargs):
        with overlap:
            assert args[:2] == ["make", "-s"]

    monkeypatch.setattr(payload, "run", make)
    build = tmp_path / "build"
    assert side_by_side(lambda: payload.build_simgpu(build)) == [build] * LABS
    assert (overlap.calls, overlap.most) == (LABS, 1)


def test_labs_started_together_on_a_fresh_machine_build_the_rootfs_once(tmp_path, monkeypatch):
    overlap = Overlap()

    def debootstrap(args, **_kwargs):
        with overlap:
            partial = Path(args[-2])
            (partial / "etc").mkdir(parents=True)
            (partial / "etc/os-release").write_text("ID=debian\n")

    monkeypatch.setattr(image, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(image, "run", debootstrap)
    monkeypatch.setattr(image, "ensure_wheels", lambda: [])
    monkeypatch.setattr(image, "ensure_wheelhouse", lambda: [])
    for step in ("_install_sglang_venv", "_install_wheelhouse"):
        monkeypatch.setattr(image, step, lambda rootfs, wheels: None)
    monkeypatch.setattr(image, "_finish", lambda rootfs: None)
    target = image.rootfs_path()
    assert side_by_side(lambda: image.ensure_image(log=lambda message: None)) == [target] * LABS
    assert overlap.calls == 1
    assert (target / "etc/os-release").read_text() == "ID=debian\n"
