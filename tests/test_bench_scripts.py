"""The benchmark scripts run end to end on a tiny store and write their JSON: a merge or a
renamed option breaks a benchmark only where nothing runs it. Behaviour only, never timing."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gnnssd import NodeLoader
from gnnssd.datasets import ArraySource
from gnnssd.storage_format import Store, write_store

from tests.conftest import REPO, random_graph_arrays
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory) -> Path:
    data = random_graph_arrays(num_nodes=20000, num_edges=100000, dim=256)  # 19.5 MiB of rows
    return write_store(tmp_path_factory.mktemp("bench") / "store",
                       ArraySource(data["features"], data["edges"], data["labels"], data["splits"]))


def test_bench_train_runs_every_row_kind_and_writes_its_json(tiny_store, tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_train.py", "--store", str(tiny_store), "--budget", "16MiB",
         "--batches", "2", "--systems", "memory", "gnnssd", "gnnssd-extents", "gnnssd-reuse", "--reuse-epochs", "2",
         "--regimes", "loader-only",
         "--seed-order", "proximity", "--seed-window", "64", "--cores", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["system"], r["cores"]): r for r in report["rows"]}
    assert {("memory", None), ("gnnssd", None), ("gnnssd-extents", None), ("gnnssd-reuse", None), ("memory", 1),
            ("gnnssd", 1)} <= set(rows)
    # gnnssd-reuse: two epochs of the seeds of the first two mini-batches (fewer: the training set is small)
    epoch = -(-min(len(Store.open(tiny_store).train_idx), 2 * 1024) // 1024)
    for row in report["rows"]:
        assert row["status"] == "ok" and not row["stopped_by_time_limit"], row
        assert row["batches"] == (2 * epoch if row["system"] == "gnnssd-reuse" else 2), row
    reuse = rows[("gnnssd-reuse", None)]
    assert reuse["reuse_epochs"] == 2 and reuse["replay_s"] > 0 and reuse["first_epoch_s"] > 0
    assert reuse["useful_bytes"] > 0 and reuse["read_amplification"] > 0
    gnnssd = rows[("gnnssd", None)]
    assert gnnssd["useful_bytes"] > 0  # a 16 MiB budget cannot hold the rows: some are read
    assert gnnssd["read_amplification"] == round(gnnssd["bytes_read"] / gnnssd["useful_bytes"], 3)
    assert report["meta"]["seed_order"] == "proximity"
    assert gnnssd["memory_budget"] == 16 << 20  # the budget as given: its x arrays in it


def test_bench_train_beside_x_gives_the_loader_its_x_arrays_on_top_of_the_budget(tiny_store, tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_train.py", "--store", str(tiny_store), "--budget", "16MiB", "--beside-x",
         "--batches", "2", "--systems", "gnnssd", "--regimes", "loader-only", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    store = Store.open(tiny_store)
    with NodeLoader(store, store.train_idx, fanouts=[15, 10, 5], batch_size=1024, features="ssd",
                    memory_budget="16MiB", device="cpu", eval_fanouts=[15, 10, 5],
                    eval_batch_size=1024) as probe:  # bench_train's fanouts and batch sizes: its x arrays

        held = probe.backend.budget.held_bytes
    assert held > 0 and row["status"] == "ok" and row["memory_budget"] == (16 << 20) + held


def test_bench_train_runs_a_heterogeneous_store_with_rgcn(tmp_path):
    store = write_store(tmp_path / "store", ToyHeteroSource(papers=20000, authors=5000, institutions=50,
                                                            feat_dim=256))  # 19.5 MiB of paper rows
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_train.py", "--store", str(store), "--budget", "16MiB", "--batches", "2",
         "--systems", "gnnssd", "per-row", "--regimes", "end-to-end", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["model"]["name"] == "rgcn" and report["meta"]["fanouts"] == [10, 5]
    rows = {r["system"]: r for r in report["rows"]}
    for system in ("gnnssd", "per-row"):
        assert rows[system]["status"] == "ok" and rows[system]["batches"] == 2, rows[system]
        assert rows[system]["useful_bytes"] > 0


def test_bench_rgcn_times_every_variant_and_checks_their_logits(tmp_path):
    store = write_store(tmp_path / "store", ToyHeteroSource(papers=600, authors=400, institutions=20))
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_rgcn.py", "--store", str(store), "--batches", "1", "--reps", "1",
         "--batch-size", "64", "--hidden", "8", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    timed = {(r["model"], r["variant"]): r for r in rows if "max |logit diff|" in r}
    assert set(timed) == {(m, v) for m in ("rgcn", "rgat") for v in ("dgl.nn", "compiled/dgl", "compiled/csc")}
    for row in timed.values():
        assert row["max |logit diff|"] < 1e-4, row
        assert row["wall ms per mini-batch"] > 0 and row["CPU ms per mini-batch"] > 0, row
    assert sum("TypedCSCBlock.from_dgl" in r["variant"] for r in rows) == 2


@pytest.mark.timeout(1200)  # four CLI runs, each importing DGL: minutes on a busy machine
def test_bench_scale_runs_the_cli_path_and_keeps_its_json_across_runs(tmp_path):
    """Preprocess (a tiny synthetic preset), two epochs in two runs (the second resumes),
    eval and layer-wise predict, each phase's figures in the JSON."""
    config = tmp_path / "tiny.yaml"
    config.write_text("store: store\nrun_dir: run\nfeatures: ssd\nmodel: {hidden: 16, layers: 2}\n"
                      "sampler: {fanouts: [5, 5], batch_size: 256}\nssd: {memory_budget: 16MiB}\n")
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "scripts/bench_scale.py", "--config", str(config), "--preset", "tiny",
           "--json", str(out)]
    first = subprocess.run([*cmd, "--epochs", "1", "--phases", "preprocess", "train"], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second = subprocess.run([*cmd, "--epochs", "2", "--phases", "preprocess", "train", "eval", "predict"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["preprocess"]["steps"]) >= {"topology", "features", "page checksums", "arrays"}
    assert report["preprocess"]["store"]["nodes"] == 5000
    assert report["train"]["resumed"] is True
    epochs = report["train"]["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    for epoch in epochs:
        assert epoch["batches"] > 0 and epoch["bytes_read"] is not None and epoch["valid_acc"] is not None
    assert epochs[1]["peak_rss_gib"] > 0
    for phase in ("eval", "predict"):
        assert report[phase]["exit_code"] == 0, report[phase]
    assert (tmp_path / "scale_predictions.npy").exists()
    # Ctrl-C: SIGINT a resumed run mid-training; it exits 130, its scratch removed
    third = subprocess.run([*cmd, "--epochs", "500", "--phases", "interrupt", "--interrupt-after", "10"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    stopped = json.loads(out.read_text())["interrupt"]
    assert stopped["exit_code"] == 130 and stopped["resumed"] is True, stopped
    assert "interrupted" in " ".join(stopped["last_lines"])
    assert stopped["exit_after_sigint_s"] >= 0 and stopped["scratch_left"] == []
    assert stopped["checkpoint_after"] is not None


def test_bench_feed_profiles_every_system_and_writes_its_json(tiny_store, tmp_path):
    out = tmp_path / "feed.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_feed.py", "--store", str(tiny_store), "--budget", "16MiB", "--batches", "2",
         "--batch-size", "16", "--threads", "1", "--systems", "memory", "ssd", "--no-warmup", "--beside-x",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"memory", "ssd"}
    for row in rows.values():
        assert row["status"] == "ok" and row["batches"] == 2 and row["threads"] == 1, row
        assert 0 < row["second_half_batches_per_s"], row
        assert row["loader_cpu_s_per_batch"] > 0 and "MainThread" in row["thread_cpu_s_per_batch"]
    assert "gather" in rows["ssd"]["stage_s_per_batch"] and rows["ssd"]["read_per_useful_byte"] > 0
    assert rows["memory"]["read_per_useful_byte"] is None
    # --beside-x: the ssd loader's x arrays on top of the 16 MiB
    assert rows["ssd"]["memory_budget"] > 16 << 20 and rows["memory"]["memory_budget"] == 16 << 20
    # without --packers (as a baseline tree runs), the row says the packers the loader chose
    from gnnssd.pipeline import default_packers

    assert rows["ssd"]["packers"] == default_packers() and rows["memory"]["packers"] is None


def test_bench_plan_stage_runs_a_baseline_beside_this_tree_with_the_same_plans(tiny_store, tmp_path):
    out = tmp_path / "plan_stage.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_plan_stage.py", "--store", str(tiny_store), "--batches", "3",
         "--batch-size", "32", "--max-rows", "40", "--baseline", "HEAD", "--work", str(tmp_path / "work"),
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["same_plans"] and [r["tree"] for r in report["rows"]] == ["@HEAD", "this tree"]
    for row in report["rows"]:
        assert row["minibatches"] == 3 and row["total_cpu_s_per_minibatch"] > 0
        assert row["piece_index_entries_per_minibatch"] > 0  # --max-rows 40: mini-batches in pieces


def test_bench_memory_parts_trains_and_names_the_parts_in_its_json(tiny_store, tmp_path):
    config = tmp_path / "config.yaml"
    # packers 0: the script looks at the trainer's process, where the planner then runs
    config.write_text(f"store: {tiny_store}\nrun_dir: {tmp_path / 'run'}\nfeatures: ssd\nseed: 0\n"
                      "model: {name: sage, hidden: 16, layers: 2}\n"
                      "sampler: {fanouts: [5, 5], batch_size: 512, eval_fanouts: [5, 5], eval_batch_size: 512}\n"
                      "ssd: {memory_budget: 16MiB, packers: 0}\n")
    for extra, name in (([], "train.json"), (["--loader-batches", "2"], "loader.json")):
        out = tmp_path / name
        result = subprocess.run([sys.executable, "scripts/bench_memory_parts.py", "--config", str(config),
                                 "--interval", "0.2", "--json", str(out), *extra],
                                cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(out.read_text())
        assert report["peak"]["rss"] > report["runtime"] > 0 and report["looks"] > 0
        assert report["largest"]["hot_masks"] == -(-20000 // 8)  # the hot rows' bitset
        assert report["io"]["bytes_read"] > 0 and report["largest"]["labels_held"] == 0
        assert "the rest" in result.stdout
        assert report["vmhwm"] >= 0.99 * report["peak"]["rss"]  # the kernel syncs RSS counters lazily
        if not extra:  # training: each step's rise and its parts, the step peaks by epoch
            steps = report["step_memory"]
            assert steps["steps"] > 0 and steps["rise"] > 0 and steps["saved_for_backward"] > 0
            assert steps["x"] > 0 and steps["blocks_after_forward"] > 0 and len(steps["step_peaks"]) == 1
    # the loader alone is looked at every mini-batch: its planner's union (table, unique rows) is seen
    assert report["largest"]["slot_maps"] > 0 and report["largest"]["plans_alive_count"] >= 1
    assert report["step_memory"] == {}


def test_bench_row_union_times_the_union_and_writes_its_json(tmp_path):
    out = tmp_path / "union.json"
    result = subprocess.run([sys.executable, "scripts/bench_row_union.py", "--rows", "100000", "--inputs", "3000",
                             "--groups", "2", "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert report["same_plans"] and row["held_bytes"] > 0 and set(row["cpu_s_per_group"]) == {"add", "take"}
    assert row["held_bytes"] < 100000 * 4  # sized by the union, not a slot a row


def test_bench_mapped_take_compares_both_lookups_and_writes_its_json(tmp_path):
    out = tmp_path / "take.json"
    result = subprocess.run([sys.executable, "scripts/bench_mapped_take.py", "--dir", str(tmp_path), "--nodes",
                             "2000000", "--ids", "100000", "--rounds", "1", "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows["mapped_take"]["resident_after_mib"] == 0 < rows["numpy indexing of the mapping"]["resident_after_mib"]
    assert not (tmp_path / "perm.npy").exists()


def test_bench_verify_times_the_first_and_the_stamped_open_and_writes_its_json(tmp_path):
    from gnnssd.storage_format.verified import RACY_NS

    path = write_store(tmp_path / "store", ArraySource(**random_graph_arrays()))
    time.sleep(RACY_NS / 1e9)  # settled files: the first open stamps them
    out = tmp_path / "verify.json"
    result = subprocess.run([sys.executable, "scripts/bench_verify.py", str(path), "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["stamped"] is True and row["nodes"] == 300
    assert row["topology_bytes"] == sum(f.stat().st_size for f in path.glob("*.npy"))
    assert row["open_s"] > 0 and row["stamped_open_s"] > 0 and row["first_over_stamped"] > 0


def test_bench_loader_open_times_each_mode_by_part_and_writes_its_json(tiny_store, tmp_path):
    out = tmp_path / "open.json"
    result = subprocess.run([sys.executable, "scripts/bench_loader_open.py", "--store", str(tiny_store),
                             "--features", "ssd,memory", "--repeats", "1", "--budget", "16MiB", "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    modes = {m["features"]: m for m in json.loads(out.read_text())["modes"]}
    assert set(modes) == {"ssd", "memory"}
    assert "x sizing (sampled mini-batches)" in modes["ssd"]["fresh_loader"]["parts"]
    assert "memory-mode features" in modes["memory"]["fresh_loader"]["parts"]
    for mode in modes.values():
        assert {"on_open_store", "beside_a_live_loader", "on_open_source", "edge_loader_on_open_source"} <= set(mode)


def test_bench_gpu_device_part_dry_runs_on_the_cpu_and_writes_its_json(tiny_store, tmp_path):
    """(d), the device tier of scripts/device_check.sh, with --device cpu: compute-only and
    features: device train, and their ratio is in the JSON."""
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_gpu.py", "--store", str(tiny_store), "--device", "cpu", "--parts", "device",
         "--quick", "--e2e-batches", "7", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["device"]
    assert [r["system"] for r in rows] == ["compute-only (held on cpu)", "gnnssd device (store on the device)"], rows
    for row in rows:
        assert row["batches"] == 2 and row["batches/s"] > 0 and row["vs compute-only"] > 0, row
    assert rows[1]["load s"] > 0 and rows[1]["sample s/mb"] > 0 and rows[1]["gather s/mb"] > 0


def _script(name: str):
    """A script of scripts/ imported as a module (its helpers tested on their own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("row_bytes", [512, 1024, 3000, 4096, 6000, 9000])
def test_read_arithmetic_counts_the_pages_rows_lie_on(row_bytes):
    rows = np.unique(np.random.default_rng(row_bytes).integers(0, 5000, 700))
    expected = sorted({page for r in rows.tolist()
                       for page in range(r * row_bytes // 4096, (r * row_bytes + row_bytes - 1) // 4096 + 1)})
    assert _script("read_arithmetic").pages_of(rows, row_bytes).tolist() == expected


def test_read_arithmetic_bounds_each_way_and_writes_its_json(tiny_store, tmp_path):
    out, scratch = tmp_path / "bound.json", tmp_path / "scratch"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "scripts/read_arithmetic.py", str(tiny_store), "--budget", "24MiB", "--beside-x",
         "--batches", "2", "--batch-size", "32", "--window", "3", "--block-budget", "16MiB", "--seconds", "0.2",
         "--scratch", str(scratch), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(scratch.iterdir()) == []  # the writer's files are removed
    row_bytes = Store.open(tiny_store).row_bytes
    for mb in report["per_minibatch"]:
        assert 0 < mb["cold_rows"] <= mb["input_rows"] and mb["cold_bytes"] == mb["cold_rows"] * row_bytes
        assert mb["cold_bytes"] <= mb["page_bytes"] <= mb["extent_bytes"] and mb["in_place_s"] > 0
    ways = {w["way"].split(" (")[0].split(",")[0]: w for w in report["ways"]}
    mean, drive, window = report["mean"], report["drive"], report["window"]
    assert ways["useful once"]["moved_mb"] == pytest.approx(mean["cold_bytes"] / 1e6)
    assert ways["in place"]["drive_s"] == pytest.approx(mean["in_place_s"])
    assert drive["read_bytes_per_s"] > 0 and drive["beside_writer"]["write_bytes_per_s"] > 0
    # the window: its plans' blocks written by the real packer, timed; its folder removed
    assert window["minibatches"] == 3 and window["plans"] >= 3 and window["read_back_s"] > 0
    assert window["blocks"] > 0 and window["written_bytes"] >= window["blocks"] * row_bytes
    assert 0 < window["scan_alone_s"] < window["repack_s"] and window["scan_bytes"] > 0
    assert window["write_bytes_per_s"] == pytest.approx(
        window["written_bytes"] / (window["repack_s"] - window["scan_alone_s"]))
    packed = ways["packed"]  # the window's row: its timed seconds over its mini-batches
    assert packed["drive_s"] == pytest.approx((window["repack_s"] + window["read_back_s"]) / 3)
    apart = ways["packed apart"]  # cold bytes written at the block writer's rate, read at the read rate
    assert apart["moved_mb"] == pytest.approx(2 * mean["cold_bytes"] / 1e6)
    assert apart["drive_s"] == pytest.approx(mean["cold_bytes"] / window["write_bytes_per_s"]
                                             + mean["cold_bytes"] / drive["read_bytes_per_s"])
    assert report["memory"]["batches_per_s"] > 0
    for way in ways.values():
        assert way["x_memory"] == pytest.approx(way["batches_per_s_most"] / report["memory"]["batches_per_s"])


def _script(name: str):
    """A script of scripts/ as a module (its functions; main is not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_feed_rounds_alternate_the_runs_after_memory_and_are_summarized_per_round():
    feed = _script("bench_feed")
    runs = [("memory",), ("ssd@base",), ("ssd",)]
    order = feed.run_order(runs, 3, [2])
    # memory leads every round (its reference); the others swap places every second round
    assert [(r, run[0]) for r, run, _ in order] == [
        (0, "memory"), (0, "ssd@base"), (0, "ssd"), (1, "memory"), (1, "ssd"), (1, "ssd@base"),
        (2, "memory"), (2, "ssd@base"), (2, "ssd")]
    rows = [{"system": run[0], "tree": "t", "threads": 2, "packers": None, "round": r, "status": "ok",
             "batches_per_s": rate} for (r, run, _), rate in zip(order, [2.0, 1.0, 0.5, 4.0, 1.0, 2.0, 1.0, 1.0, 1.0])]
    rows.append({**rows[-1], "status": "failed (exit 1)", "batches_per_s": None})  # a failed run: left out
    summary = {s["system"]: s for s in feed.summarize(rows)}
    assert summary["ssd"]["rounds"] == 3 and summary["memory"]["rounds"] == 3
    # the ratio is to its own round's memory: 0.25, 0.25, 1.0 (not the mean rate over a mean)
    assert summary["ssd"]["x_memory"] == {"mean": 0.5, "min": 0.25, "max": 1.0}
    assert summary["ssd@base"]["batches_per_s"] == {"mean": 4 / 3, "min": 1.0, "max": 2.0}
    assert "ssd" in feed.fmt_summary(summary["ssd"]) and "x3" in feed.fmt_summary(summary["ssd"])
