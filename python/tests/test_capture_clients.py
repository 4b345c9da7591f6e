"""The bookkeeping of CUDA graph captures' own PJRT clients (``handoff._capture``), with
fake clients: one client per live capture, the same one for every crossing of that
capture, given back when the graph is gone, reused, and capped. (The crossings that
lease them run on a GPU: ``bench/gpu_graph_checks.py``.)"""

import gc
import subprocess
import sys

import pytest

import handoff
from handoff import _capture


class FakeDevice:
    def __init__(self, client, ordinal):
        self.client, self.local_hardware_id = client, ordinal

    def memory_stats(self):
        return {"bytes_in_use": 100 * self.client.n, "pool_bytes": 1000}


class FakeClient:
    made = 0

    def __init__(self):
        FakeClient.made += 1
        self.n = FakeClient.made
        self.devices = [FakeDevice(self, 0), FakeDevice(self, 1)]

    def local_devices(self):
        return self.devices


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(_capture, "_make_client", lambda ordinal: FakeClient())
    monkeypatch.setattr(_capture, "_free", {})
    monkeypatch.setattr(_capture, "_made", {})
    monkeypatch.setattr(_capture, "_leased", {})
    monkeypatch.setattr(_capture, "_limit", 8)
    monkeypatch.setattr(_capture, "ENABLED", True)
    FakeClient.made = 0


def test_one_client_per_capture_kept_until_the_graph_is_gone(fake):
    device, token = _capture.lease(0, 101)
    assert device.local_hardware_id == 0 and token is not None
    # Every later crossing of the same capture: the same device, nothing more to keep.
    again, more = _capture.lease(0, 101)
    assert again is device and more is None
    # Another capture while the first graph lives: another client.
    other, other_token = _capture.lease(0, 102)
    assert other.client is not device.client and other_token is not None
    assert _capture.capture_clients()["leased"] == {0: 2}
    # The first graph is destroyed (the token kept with it is dropped): its client is
    # idle and serves the next capture; the second graph's is still held.
    del token
    gc.collect()
    assert _capture.capture_clients()["leased"] == {0: 1}
    third, _ = _capture.lease(0, 103)
    assert third.client is device.client
    assert FakeClient.made == 2
    assert _capture.capture_clients()["made"] == {0: 2}


def test_devices_apart(fake):
    d0, t0 = _capture.lease(0, 7)
    d1, t1 = _capture.lease(1, 7)  # the same capture id on another device
    assert d0.local_hardware_id == 0 and d1.local_hardware_id == 1
    assert d0.client is not d1.client and t0 is not None and t1 is not None


def test_limit_refused_naming_it(fake):
    handoff.capture_clients(limit=2)
    tokens = [_capture.lease(0, c)[1] for c in (1, 2)]
    with pytest.raises(handoff.HandoffError, match=r"limit 2.*capture_clients\(limit=\.\.\.\)"):
        _capture.lease(0, 3)
    tokens.pop()
    gc.collect()
    assert _capture.lease(0, 3)[1] is not None  # a graph gone: its client serves


def test_switched_off_leaves_jax_own_device(fake, monkeypatch):
    monkeypatch.setattr(_capture, "ENABLED", False)
    assert _capture.lease(0, 5) == (None, None)
    assert FakeClient.made == 0


def test_off_by_default_and_switched_on():
    # A fresh process: off, and a crossing inside a capture would keep JAX's own device.
    code = ("import handoff; from handoff import _capture; "
            "print(handoff.capture_clients()['enabled'], _capture.lease(0, 1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "(None,", "None)"]
    try:
        assert handoff.capture_clients(enabled=True)["enabled"] is True and _capture.ENABLED is True
        with pytest.raises(ValueError, match="enabled must be a bool, got 1"):
            handoff.capture_clients(enabled=1)
    finally:
        handoff.capture_clients(enabled=False)


def test_report_and_bad_limits(fake):
    _, token = _capture.lease(0, 9)
    report = handoff.capture_clients()
    assert report["enabled"] is True
    assert report["limit"] == 8 and report["made"] == {0: 1} and report["leased"] == {0: 1}
    assert report["memory"] == [{"ordinal": 0, "bytes_in_use": 100, "pool_bytes": 1000}]
    with pytest.raises(ValueError, match="limit must be a positive int, got 0"):
        handoff.capture_clients(limit=0)
    with pytest.raises(ValueError, match=r"memory_fraction must be in \(0, 1\], got 1.5"):
        handoff.capture_clients(memory_fraction=1.5)
    del token
