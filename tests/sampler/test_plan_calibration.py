"""Calibration measures the drive through the loader's I/O path and round-trips as JSON."""
import json

import numpy as np

from gnnssd.pipeline.calibration import CALIBRATION_FILE, calibrate, load_cost_model
from gnnssd.sampler.readplan import CostModel


def test_calibrate_saves_a_usable_model(tmp_path):
    assert load_cost_model(tmp_path) == CostModel.default()
    (tmp_path / "features.bin").write_bytes(np.random.default_rng(0).bytes(8 << 20))
    model = calibrate(tmp_path, seconds=0.05, queue_depth=8)
    saved = json.loads((tmp_path / CALIBRATION_FILE).read_text())
    assert [r["size"] for r in saved["reads"]] == [4096, 16384, 65536, 262144, 1 << 20]
    assert model.read_bw > 0 and model.write_bw > 0 and model.request_s >= 0
    assert load_cost_model(tmp_path) == model
    assert not list(tmp_path.glob("*.tmp"))
