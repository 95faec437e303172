"""Load curves: CSV reading with clear errors, normalisation, interpolation, the real series."""

from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.sim import loadcurve
from agmarl_common.core.sim.loadcurve import LoadCurve, fit_to_horizon, load_curve, read_series, sinusoid_curve


def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "series.csv"
    p.write_text(text)
    return p


def test_read_series_reads_one_column(tmp_path):
    p = _csv(tmp_path, "a,cpu\n9,1\n9,2.5\n9,3\n")
    assert read_series(p, "cpu").tolist() == [1.0, 2.5, 3.0]


@pytest.mark.parametrize("text, column, message", [
    ("a,cpu\n1,2\n", "mem", "no column 'mem'"),
    ("a,cpu\n1,x\n", "cpu", "series.csv:2: cpu='x' is not a number"),
    ("a,cpu\n1,nan\n", "cpu", "not finite"),
    ("a,cpu\n", "cpu", "no rows"),
    ("", "cpu", "no column"),
])
def test_read_series_errors_are_clear(tmp_path, text, column, message):
    with pytest.raises(ValueError, match=message):
        read_series(_csv(tmp_path, text), column)


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        read_series(tmp_path / "nope.csv", "cpu")
    with pytest.raises(ValueError, match="not found"):
        load_curve("alibaba2018", path=tmp_path)  # a folder without the file


def test_load_curve_normalises_to_mean_one(tmp_path):
    c = load_curve("mine", path=_csv(tmp_path, "cpu\n1\n2\n3\n2\n"), column="cpu", step_s=60)
    assert c.values.tolist() == pytest.approx([0.5, 1.0, 1.5, 1.0])
    assert c.step_s == 60 and c.period_s == 240


def test_unknown_series_name_without_path_is_rejected():
    with pytest.raises(ValueError, match="unknown load series"):
        load_curve("sinusoid")


@pytest.mark.parametrize("t, expected", [
    (0, 0.5), (30, 0.75), (60, 1.0), (150, 1.25), (210, 0.75), (240, 0.5), (-30, 0.75), (270, 0.75),
])
def test_multiplier_interpolates_linearly_and_wraps(t, expected):
    c = LoadCurve(values=np.array([0.5, 1.0, 1.5, 1.0]), step_s=60.0)
    assert float(c.multiplier(t)) == pytest.approx(expected)


def test_normalise_rejects_bad_values_and_clips_at_floor():
    with pytest.raises(ValueError):
        loadcurve.normalise(np.array([1.0, np.nan]))
    with pytest.raises(ValueError):
        loadcurve.normalise(np.array([-1.0, 0.0]))
    v = loadcurve.normalise(np.array([0.0, 2.0]), floor=0.1)
    assert v.mean() == pytest.approx(1.0) and v.min() > 0


def test_fit_to_horizon_squeezes_a_window_onto_the_horizon():
    c = LoadCurve(values=np.array([1.0, 3.0, 1.0, 3.0]), step_s=300.0)
    f = fit_to_horizon(c, horizon_s=100.0, span_s=600.0, offset_s=300.0, points=2)
    assert f.step_s == 50.0
    assert f.values.tolist() == pytest.approx([1.5, 0.5])  # samples 3, 1 renormalised


def test_sinusoid_only_on_request():
    s = sinusoid_curve(period_s=100, amplitude=0.5, steps=4)
    assert s.values.tolist() == pytest.approx([1.0, 1.5, 1.0, 0.5])
    with pytest.raises(ValueError):
        sinusoid_curve(amplitude=1.0)


@pytest.mark.parametrize("name, rows", [("alibaba2018", 2243), ("azure_v2", 8640), ("google2019", 8064)])
def test_real_series_load_from_the_default_folder(name, rows):
    assert loadcurve.default_series_dir().is_dir()
    c = load_curve(name)
    assert len(c.values) == rows
    assert c.values.mean() == pytest.approx(1.0)
    assert c.values.min() > 0
    assert c.values.max() / c.values.min() > 1.2  # real variation, not a flat line
    assert c.step_s == 300.0


def test_alibaba_day_has_a_diurnal_swing():
    day = fit_to_horizon(load_curve("alibaba2018"), horizon_s=3600.0)
    assert len(day.values) == 288 and day.step_s == pytest.approx(12.5)
    assert day.values.max() > 1.5 * day.values.min()
