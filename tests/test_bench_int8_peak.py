"""bench.int8_peak: the int8 multiply-add rate of this CPU with the GEMMs' own instructions, the roof
bench.profile_step holds the LM head against."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import int8_peak


def test_the_floor_is_the_multiply_adds_over_the_rate() -> None:
    row = int8_peak.head_floor(gmac=5.369, peak=140.0, measured_ms=55.0)
    assert row == {"gmac": 5.369, "floor_ms": 38.35, "measured_ms": 55.0, "share_of_peak": 0.697}


@pytest.mark.skipif(not int8_peak.isas(), reason="no C kernels on this machine")
def test_each_instruction_set_here_has_a_rate_and_the_others_are_refused(tmp_path: Path) -> None:
    result = int8_peak.main(["--out", str(tmp_path / "peak.json")])
    assert set(result["isas"]) == set(int8_peak.isas())
    for isa, row in result["isas"].items():
        assert math.isfinite(row["gmac_s"]) and row["gmac_s"] > 0 and row["gmac_s_one_thread"] > 0, isa
    assert json.loads((tmp_path / "peak.json").read_text())["isas"] == result["isas"]
    for isa in set(int8_peak.SOURCES) - set(int8_peak.isas()):
        with pytest.raises(ValueError, match="does not run here"):
            int8_peak.peak_gmac_s(isa)
