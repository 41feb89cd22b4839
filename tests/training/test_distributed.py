"""Data-parallel training on real processes (gloo on the CPU, ranks on 127.0.0.1)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data.distributed import DistributedSampler

from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.core.runtime import run_seed
from gnnssd.datasets import PlanetoidSource, synthetic_source
from gnnssd.loading.node_loader import NodeLoader
from gnnssd.sampler import Shuffled, node_order, seed_batches
from gnnssd.sampler.seed_order import shard
from gnnssd.storage_format import Store, write_store
from gnnssd.training.checkpoint import load_checkpoint
from gnnssd.training.tasks import Trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("tiny") / "store", synthetic_source("tiny"),
                       order=node_order("degree"))


@pytest.fixture(scope="module")
def cora_store(tmp_path_factory, planetoid_root):
    return write_store(tmp_path_factory.mktemp("cora") / "store", PlanetoidSource(planetoid_root, "cora"))


def _write_config(path: Path, store: Path, **sections) -> Path:
    data = {"store": str(store), "run_dir": str(path.parent / "run"), "seed": 3,
            "model": {"name": "sage", "hidden": 32, "layers": 2},
            "sampler": {"fanouts": [5, 5], "batch_size": 256},
            "train": {"epochs": 2, "lr": 0.01, "progress": False},
            "ssd": {"memory_budget": "64MiB"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def _gnnssd(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI; past `timeout` the test fails with where each of its processes was."""
    command = [sys.executable, "-m", "gnnssd", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            where = _stacks(proc.pid)
            for process in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                process.kill()
            out, err = proc.communicate()
            pytest.fail(f"{' '.join(args)}: still running after {timeout} s\n--- stdout\n{out}\n--- stderr\n"
                        f"{err}\n--- its processes\n{where}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _stacks(pid: int) -> str:
    """Each process of the tree under `pid`: its command, state and threads' kernel wait
    channels, and its Python and native stacks where py-spy is installed."""
    spy = shutil.which("py-spy")
    lines = []
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            lines.append(f"pid {process.pid} {process.status()}: {' '.join(process.cmdline())[:200]}")
            for thread in process.threads():
                wchan = Path(f"/proc/{process.pid}/task/{thread.id}/wchan")
                lines.append(f"  thread {thread.id}: {wchan.read_text() if wchan.exists() else '?'}")
        except psutil.Error as exc:
            lines.append(f"pid {process.pid}: {exc}")
            continue
        if spy:
            dump = subprocess.run([spy, "dump", "--native", "--pid", str(process.pid)],
                                  capture_output=True, text=True, timeout=60)
            lines.append(dump.stdout + dump.stderr)
    return "\n".join(lines)


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("n, world", [(10, 3), (9, 3), (7, 2), (1, 4), (12, 1)])
def test_shard_deals_seeds_as_distributed_sampler(n, world):
    order = np.random.default_rng(n).permutation(100)[:n]
    shards = [shard(order, rank, world) for rank in range(world)]
    for rank, part in enumerate(shards):
        reference = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        np.testing.assert_array_equal(part, order[reference])
    assert len({len(part) for part in shards}) == 1
    assert set(np.concatenate(shards)) == set(order)


def test_shard_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank 2 outside 0..1"):
        shard(np.arange(4), 2, 2)


def test_node_loader_ranks_take_their_shard_of_the_global_order_in_every_mode(tiny_store):
    """Rank r of 3 iterates over DistributedSampler's share of the one-process epoch order,
    the same mini-batches in memory and ssd mode; a with_seeds view is not sharded."""
    store = Store.open(tiny_store)
    train = np.asarray(store.train_idx)
    (order,) = seed_batches(train, len(train), Shuffled(), 5, 2)
    reference = [order[list(DistributedSampler(range(len(order)), num_replicas=3, rank=r, shuffle=False))]
                 for r in range(3)]
    for features in ("memory", "ssd"):
        for rank in range(3):
            with NodeLoader(store, train, fanouts=[3, 3], batch_size=128, features=features, shuffle=True,
                            seed=5, device="cpu", memory_budget="16MiB", rank=rank, world_size=3) as loader:
                loader.set_epoch(2)
                got = [mb.output_nodes.numpy() for mb in loader]
                assert len(got) == len(loader) == -(-len(reference[rank]) // 128)
                np.testing.assert_array_equal(np.concatenate(got), reference[rank])
                view = loader.with_seeds(train[:300], batch_size=128)
                assert len(view) == 3
                np.testing.assert_array_equal(np.concatenate([mb.output_nodes.numpy() for mb in view]),
                                              train[:300])


def test_node_loader_rejects_a_rank_outside_the_world(tiny_store):
    with pytest.raises(ValueError, match="rank 2, world_size 2"):
        NodeLoader(Store.open(tiny_store), np.arange(10), fanouts=[2], batch_size=4, rank=2, world_size=2)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_two_ranks_equal_one_process_on_the_global_batches(tiny_store, tmp_path, features):
    """Deterministic mode, all neighbours, no dropout: after one epoch the two ranks' model
    equals one process that steps on each global mini-batch (the two ranks' k-th batches).

    The reference takes the loss of a global batch as the mean of its two halves' mean
    losses (equal halves: the global mean), half by half as DDP does. With the dgl.nn
    layers: with the MP-DFG compiled ones, two one-process runs of this loop already differ
    by ~2e-3 in a few first-layer weights (Adam magnifies differences in tiny gradients),
    depending on what ran before them in the process."""
    sections = dict(features=features, deterministic=True, model={"dropout": 0.0, "compile": False},
                    sampler={"fanouts": [-1, -1], "batch_size": 256}, train={"epochs": 1})
    config = _write_config(tmp_path / "ddp" / "config.yaml", tiny_store, **sections)
    done = _gnnssd("train", "--config", str(config), "--nproc", "2")
    assert done.returncode == 0, done.stderr
    ranks_model = load_checkpoint(tmp_path / "ddp" / "run")["model"]

    cfg = config_from_dict({**yaml.safe_load(config.read_text()), "run_dir": str(tmp_path / "one")})
    one = Trainer(cfg)
    (order,) = seed_batches(one.store.train_idx, len(one.store.train_idx), Shuffled(), run_seed(cfg.seed), 1)
    per_rank = [order[list(DistributedSampler(range(len(order)), num_replicas=2, rank=r, shuffle=False))]
                for r in range(2)]
    one.model.train()
    steps = 0
    for start in range(0, len(per_rank[0]), 256):
        losses = []
        for seeds in (part[start:start + 256] for part in per_rank):
            (batch,) = one.loader.with_seeds(seeds, fanouts=[-1, -1], batch_size=len(seeds))
            losses.append(F.cross_entropy(one.model(batch.blocks, batch.x), batch.y))
        one.optimizer.zero_grad()
        (sum(losses) / 2).backward()
        one.optimizer.step()
        steps += 1
    one.close()
    assert steps == 3  # 1500 seeds: 750 a rank, batches of 256, 256, 238
    for name, value in one.model.state_dict().items():
        torch.testing.assert_close(ranks_model[name], value, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_nproc_2_trains_a_relational_model_on_a_typed_store(tmp_path, model):
    """R-GCN/R-GAT on two ranks: a mini-batch's last layer has no destination of the
    non-target types (their relations run on no edge), so some parameters get no gradient
    in a step, which data-parallel training must allow; it learns above chance."""
    from gnnssd.datasets import hetero_synthetic_source

    store = write_store(tmp_path / "store", hetero_synthetic_source("mag-small", papers=3000, authors=2500,
                                                                    institutions=60))
    config = _write_config(tmp_path / "typed" / "config.yaml", store, features="ssd",
                           model={"name": model, "hidden": 32, "dropout": 0.0},
                           sampler={"fanouts": [5, 5], "batch_size": 128}, train={"epochs": 3})
    done = _gnnssd("train", "--config", str(config), "--nproc", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    records = _metrics(tmp_path / "typed" / "run")
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[-1]["test_acc"] > 3 / 16, records[-1]  # 16 classes


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_nproc_2_trains_cora(cora_store, tmp_path, features):
    config = _write_config(tmp_path / "cora" / "config.yaml", cora_store, features=features,
                           model={"hidden": 64}, sampler={"fanouts": [10, 10], "batch_size": 70},
                           train={"epochs": 10, "weight_decay": 5e-4}, ssd={"memory_budget": "160MiB"})
    done = _gnnssd("train", "--config", str(config), "--nproc", "2")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "cora" / "run"
    records = _metrics(run)
    assert [r["epoch"] for r in records] == list(range(1, 11))  # rank 0 alone writes
    assert records[-1]["test_acc"] > 0.6  # 7 classes; two ranks of 70 seeds cover the 140
    assert records[-1]["batches"] == 1
    assert load_checkpoint(run)["world_size"] == 2
    assert done.stdout.count("best valid accuracy") == 1

    with pytest.raises(ConfigError, match="trained on 2 rank"):
        Trainer(config_from_dict(yaml.safe_load(config.read_text()))).fit(resume=True)


def _rank_pids(launcher: int) -> list[int]:
    """The rank processes the elastic agent spawned under `launcher`."""
    pids = []
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            pids.append(int(child))
    return pids


def test_a_killed_rank_stops_the_other_with_its_name_and_resume_continues(cora_store, tmp_path):
    config = _write_config(tmp_path / "kill" / "config.yaml", cora_store,
                           sampler={"fanouts": [10, 10], "batch_size": 70}, train={"epochs": 10_000})
    run = tmp_path / "kill" / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "gnnssd", "train", "--config", str(config),
                                 "--nproc", "2"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(_metrics(run)) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.2)
        victim = _rank_pids(launcher.pid)[-1]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert time.monotonic() - killed < 60
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode != 0
    assert f"pid {victim}) killed by SIGKILL" in stderr
    done_epochs = load_checkpoint(run)["epoch"]  # the last finished epoch's checkpoint loads
    assert done_epochs >= 2

    resumed = _gnnssd("train", "--config", str(config), "--nproc", "2", "--resume",
                      "--set", f"train.epochs={done_epochs + 1}")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["epoch"] for r in _metrics(run)] == list(range(1, done_epochs + 2))


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_rank_stopped_inside_a_collective_it_entered_is_named_by_its_silent_heartbeat():
    """The race the hung-rank test once lost: the victim stopped after posting that it entered
    the collective, so its count equals the survivor's; only its heartbeat tells."""
    from datetime import timedelta

    import torch.distributed as dist

    from gnnssd.core.ranks import Ranks
    from gnnssd.training.distributed import Heartbeat, Progress

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                           wait_for_workers=False)
    beats = [Heartbeat("127.0.0.1", port, rank) for rank in (0, 1)]
    survivor, victim = (Progress(server, Ranks(rank, 2), beats[rank]) for rank in (0, 1))
    for _ in range(3):
        survivor.enter()
        victim.enter()
    time.sleep(1.5)
    assert survivor.stalled() == {}  # both alive and level: an error is not about the others
    beats[1].stop()  # rank 1 hangs after entering collective 3
    message = str(survivor.failure(RuntimeError("gloo: timed out waiting for recv")))
    assert "rank 1 (at collective 3) stopped answering" in message and "gloo: timed out" in message
    beats[0].stop()


def test_a_rank_whose_job_fails_stops_its_heartbeat_before_exiting():
    """The CI flake of a refused rank ending with SIGABRT instead of exit 2: its daemon
    heartbeat thread was inside a store call when the interpreter exited."""
    script = ("import threading\n"
              "from gnnssd.training import distributed\n"
              "def job():\n"
              "    assert any(t.name == 'gnnssd-heartbeat' for t in threading.enumerate())\n"
              "    raise ValueError('refused')\n"
              "try:\n"
              "    distributed.run_rank(job)\n"
              "except ValueError as exc:\n"
              "    print('job failed:', exc)\n"
              "print('threads:', sorted(t.name for t in threading.enumerate()))\n")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "job failed: refused" in done.stdout, done.stdout
    assert "gnnssd-heartbeat" not in done.stdout, done.stdout


def test_the_store_check_between_epochs_times_out_like_a_step():
    """The CI flake of the hung-rank test: its victim stopped at an epoch's end, while the
    survivor waited in the per-epoch store check, a broadcast under the set-up's ten-minute
    timeout. Between epochs it is a training collective: rank 1 never joins, rank 0 fails
    after GNNSSD_DIST_TIMEOUT (2 s here)."""
    script = ("import time\n"
              "from gnnssd.core import current\n"
              "from gnnssd.training import distributed\n"
              "def job():\n"
              "    ranks = current()\n"
              "    if ranks.rank == 1:\n"
              "        time.sleep(300)\n"
              "    start = time.monotonic()\n"
              "    try:\n"
              "        distributed.from_rank0(lambda: 'checked', ranks, training=True)\n"
              "    except RuntimeError as exc:\n"
              "        print(f'failed after {time.monotonic() - start:.1f} s: {exc}')\n"
              "distributed.run_rank(job)\n")
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "GNNSSD_DIST_TIMEOUT": "2"}
    ranks = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in (0, 1)]
    try:
        out, err = ranks[0].communicate(timeout=120)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert "failed after" in out, err[-3000:]
    assert float(out.split("failed after ")[1].split(" s")[0]) < 30, out


def test_a_hung_rank_is_named_by_the_other_within_the_timeout(cora_store, tmp_path):
    config = _write_config(tmp_path / "hang" / "config.yaml", cora_store,
                           sampler={"fanouts": [10, 10], "batch_size": 70}, train={"epochs": 10_000})
    run = tmp_path / "hang" / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "gnnssd", "train", "--config", str(config),
                                 "--nproc", "2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "GNNSSD_DIST_TIMEOUT": "10"})
    victim = None
    try:
        deadline = time.monotonic() + 300
        while len(_metrics(run)) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.2)
        survivor, victim = _rank_pids(launcher.pid)
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        while _running(survivor):  # 10 s until its collective fails
            assert time.monotonic() - stopped < 60
            time.sleep(0.2)
        # A stopped process keeps the launcher's SIGTERM pending (and torch.multiprocessing
        # waits for it without a limit): a real hang dies of it, this one needs a SIGKILL.
        os.kill(victim, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if victim is not None and _running(victim):  # a stopped rank left behind holds its memory
            os.kill(victim, signal.SIGKILL)
        launcher.kill()
        launcher.wait()
    assert "rank 1 (at collective" in stderr or "lost contact with rank 0" in stderr, stderr[-3000:]
    assert launcher.returncode != 0
    assert load_checkpoint(run)["epoch"] >= 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_as_ranks(configs: list[Path], timeout: float = 300, **env: str) -> list[tuple[int, str]]:
    """`gnnssd train` once per config as torchrun would start the ranks (RANK, WORLD_SIZE,
    MASTER_ADDR...); each rank's (return code, stderr), once all have stopped."""
    env = {"WORLD_SIZE": str(len(configs)), "LOCAL_WORLD_SIZE": str(len(configs)),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), **env}
    ranks = [subprocess.Popen([sys.executable, "-m", "gnnssd", "train", "--config", str(config)], cwd=REPO,
                              env={**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, config in enumerate(configs)]
    try:
        errors = [process.communicate(timeout=timeout)[1] for process in reversed(ranks)]
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    return [(process.returncode, stderr) for process, stderr in zip(reversed(ranks), errors)]


def test_ranks_on_different_stores_are_refused(tiny_store, tmp_path):
    """Two torchrun-style ranks (RANK, WORLD_SIZE, MASTER_ADDR...) whose configs name
    different stores: both stop before training and say which stores differ."""
    other = write_store(tmp_path / "other", synthetic_source("tiny", seed=1), order=node_order("degree"))
    configs = [_write_config(tmp_path / f"rank{rank}" / "config.yaml", store)
               for rank, store in enumerate((tiny_store, other))]
    for returncode, stderr in train_as_ranks(configs):
        assert returncode != 0
        assert "the ranks opened different stores" in stderr and "rank 1:" in stderr, stderr[-2000:]
    assert not (tmp_path / "rank0" / "run" / "metrics.jsonl").exists()
