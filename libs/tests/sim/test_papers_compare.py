"""tools.bench.papers.compare: two papers.json differ only where a simulated field differs."""

from __future__ import annotations

import json
import math

from tools.bench.papers.compare import differences, main


def _run(norm: float, wall: float) -> dict:
    return {
        "meta": {"wall_s": wall},
        "papers": {
            "seallm": {
                "rows": [{"policy": "vllm", "norm": norm, "sim_wall_s": wall, "p99": math.nan}],
                "unit_times": {"a": {"wall_s": wall, "cpu_s": wall}},
                "cpu_s": wall,
            }
        },
    }


def test_times_are_left_out_and_simulated_fields_compared(tmp_path, capsys):
    a, b = _run(2.5, 10.0), _run(2.5, 99.0)
    assert differences(a["papers"], b["papers"]) == []  # NaN equals NaN; times do not count
    c = _run(2.6, 10.0)
    assert differences(a["papers"], c["papers"]) == ["/seallm/rows[0]/norm: 2.5 vs 2.6"]
    d = _run(2.5, 10.0)
    d["papers"]["seallm"]["rows"].append({"policy": "seallm"})
    assert differences(a["papers"], d["papers"]) == ["/seallm/rows: 1 vs 2 entries"]
    paths = []
    for i, run in enumerate((a, b, c)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(run))
    assert main([str(paths[0]), str(paths[1])]) == 0
    assert main([str(paths[0]), str(paths[2])]) == 1
    assert "seallm/rows[0]/norm: 2.5 vs 2.6" in capsys.readouterr().out
