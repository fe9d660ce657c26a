"""benchmarks/vs_torchft.py without running it: its arguments, the skip reason and the result rows.

The benchmark itself (real processes, timings) is not part of the test suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.benchmark_scripts import benchmark_scripts


@pytest.fixture(scope="module")
def vs() -> Any:
    with benchmark_scripts("vs_torchft") as scripts:
        yield scripts["vs_torchft"]


def test_arguments_default_to_no_torchft_and_the_brief_sizes(vs: Any) -> None:
    args = vs.parser().parse_args([])
    assert args.torchft_python is None
    assert (args.members, args.state_mb, args.repeats) == (3, 50.0, 3)
    args = vs.parser().parse_args(["--torchft-python", "/x/bin/python", "--state-mb", "555", "--repeats", "5"])
    assert (args.torchft_python, args.state_mb, args.repeats) == ("/x/bin/python", 555.0, 5)


def test_torchft_rows_are_skipped_with_a_reason(vs: Any, tmp_path: Path) -> None:
    assert vs.torchft_available(None) == "no --torchft-python given"
    assert "does not exist" in vs.torchft_available(str(tmp_path / "python"))
    (tmp_path / "python").write_text("")
    assert "no torchft_lighthouse" in vs.torchft_available(str(tmp_path / "python"))


def test_main_refuses_fewer_than_two_members(vs: Any) -> None:
    with pytest.raises(SystemExit, match="at least 2"):
        vs.main(["--members", "1"])


def trial(chaos_resume: float, torchft_resume: float | None, ddp: float) -> dict[str, Any]:
    return {
        "chaosp2p": {"kill_default": {"resume_s": chaos_resume}, "steady": {"period_s": 0.2}},
        "torchft": {"kill_default": {"resume_s": torchft_resume}, "steady": {"period_s": 0.15}},
        "ddp": {"period_s": ddp},
    }


def test_rows_hold_medians_ratios_and_how_often_a_measure_was_reached(vs: Any) -> None:
    rows = {
        r["measure"]: r
        for r in vs.summarize(
            [trial(0.2, 5.0, 0.1), trial(0.3, None, 0.1), trial(0.4, 7.0, 0.1)], ["chaosp2p", "torchft"]
        )
    }
    kill = rows["kill -9 -> survivors step again, default timeouts (s)"]
    assert kill["chaosp2p"] == pytest.approx(0.3)
    assert kill["torchft"] == pytest.approx(6.0)  # the median of the two repeats that resumed
    assert (kill["chaosp2p_reached"], kill["torchft_reached"]) == ("3/3", "2/3")
    assert kill["torchft_over_chaosp2p"] == pytest.approx(20.0)
    never = rows["join: newcomer launch -> its first step (s)"]
    assert never["chaosp2p"] is None and "torchft_over_chaosp2p" not in never
    overhead = rows["steady step period over plain DDP (gloo), x"]
    assert (overhead["chaosp2p"], overhead["torchft"], overhead["ddp_period_s"]) == pytest.approx((2.0, 1.5, 0.1))


def test_rows_without_torchft_have_no_torchft_column(vs: Any) -> None:
    rows = vs.summarize([{"chaosp2p": {"kill_tuned": {"resume_s": 0.2}}}], ["chaosp2p"])
    assert all("torchft" not in row and "torchft_over_chaosp2p" not in row for row in rows)
    assert rows[1]["chaosp2p"] == pytest.approx(0.2)
