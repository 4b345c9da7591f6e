"""DDP and FSDP2 (``fully_shard``) over a model with a ``handoff.torch_function`` layer,
with gloo in 2 CPU processes (``distributed_train.py``), eager and under
``torch.compile``: the parameters after 10 SGD steps equal single-process training on
the whole batches (relative error at most 1e-5), with 0 graph breaks (DDP's own graph
splits, made on purpose at its buckets, are not breaks)."""

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("jax")
torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this PyTorch has no gloo backend", allow_module_level=True)

import distributed_train  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference():
    return distributed_train.reference()


@pytest.mark.parametrize("how", ["eager", "compiled"])
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_two_processes_train_as_one(tmp_path, reference, wrap, how):
    out = tmp_path / "state.pt"
    port = str(free_port())
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    script = os.path.join(HERE, "distributed_train.py")
    procs = [
        subprocess.Popen([sys.executable, script, str(r), "2", port, wrap, how, str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    got = torch.load(out)
    assert got["graph_breaks"] == 0
    assert got["executions"] == 2 * distributed_train.STEPS, "every step ran the JAX layer once each way"
    for k, want in reference.items():
        err = ((got["state"][k] - want).norm() / want.norm()).item()
        assert err <= 1e-5, f"{wrap} {how}: parameter {k}: relative error {err:.3g}"
