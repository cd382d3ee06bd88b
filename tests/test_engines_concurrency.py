"""Issue 53: the servers' concurrency sweep as a file (every row names the machine and its load
average), read back in numeric order of concurrency, and the Benchmark tab's charts of it. No
server here: tests/test_llama_server.py sweeps real llama-servers."""

import csv

import pytest

from specdemo.interfaces import bench_ui
from specdemo.services import endpoint_bench as eb

#: a sweep's rows as a CSV might hold them: levels out of numeric order (16 before 2 as text)
LEVELS = (1, 16, 2, 8, 4)
SPEEDUPS = {1: 0.81, 2: 1.07, 4: 1.24, 8: 0.93, 16: 1.5}


def row(n: int, lane: str, tokens_per_s: float, **extra) -> dict:
    base = {c: None for c in eb.COLUMNS}
    base.update(concurrency=n, lane=lane, engine="llama.cpp", endpoint="http://127.0.0.1:1",
                requests=n, repeats=3, total_tokens_per_s=tokens_per_s, mean_latency_s=2.5 * n,
                mean_ttft_s=0.4 * n, new_tokens=64 * n, cpu_model="Test CPU", load_before=0.25 + n,
                load_after=1.5 + n)
    base.update(extra)
    return base


def sweep_rows() -> list[dict]:
    rows = [row(n, "speculative", 10.0 * n * SPEEDUPS[n], speedup=SPEEDUPS[n]) for n in LEVELS]
    return rows + [row(n, "plain", 10.0 * n) for n in LEVELS]


def write_csv(path, rows, columns=eb.COLUMNS):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r.get(k) is None else r[k] for k in columns})
    return path


def test_read_csv_orders_levels_as_numbers_and_keeps_the_values(tmp_path):
    rows = eb.read_csv(write_csv(tmp_path / "c.csv", sweep_rows()))
    assert [(r["lane"], r["concurrency"]) for r in rows] == (
        [("plain", n) for n in (1, 2, 4, 8, 16)] + [("speculative", n) for n in (1, 2, 4, 8, 16)])
    assert eb.speedups(rows) == [(n, SPEEDUPS[n]) for n in (1, 2, 4, 8, 16)]
    assert rows[0]["cpu_model"] == "Test CPU" and rows[0]["load_before"] == 1.25
    assert rows[0]["errors"] is None and rows[0]["acceptance_rate"] is None


def test_an_older_file_without_machine_columns_reads_with_none(tmp_path):
    old = [c for c in eb.COLUMNS if c not in ("cpu_model", "load_before", "load_after")]
    rows = eb.read_csv(write_csv(tmp_path / "old.csv", sweep_rows(), old))
    assert {(r["cpu_model"], r["load_before"], r["load_after"]) for r in rows} == {(None, None, None)}
    assert eb.speedups(rows)[-1] == (16, 1.5)


def test_a_cell_that_is_not_a_number_is_named(tmp_path):
    rows = sweep_rows()
    rows[3]["speedup"] = "fast"
    with pytest.raises(ValueError, match=r"line 5: speedup is 'fast', not a number"):
        eb.read_csv(write_csv(tmp_path / "bad.csv", rows))


def test_the_tabs_charts_hold_the_csvs_speedups_in_numeric_order(tmp_path):
    path = write_csv(tmp_path / "c.csv", sweep_rows())
    intro, speedup, tokens = bench_ui.measured_charts("en", path)
    assert speedup["value"].values.tolist() == [[str(n), SPEEDUPS[n]] for n in (1, 2, 4, 8, 16)]
    assert tokens["value"].values.tolist() == (
        [[str(n), 10.0 * n, "plain"] for n in (1, 2, 4, 8, 16)]
        + [[str(n), 10.0 * n * SPEEDUPS[n], "speculative"] for n in (1, 2, 4, 8, 16)])
    assert speedup["sort"] == tokens["sort"] == ["1", "2", "4", "8", "16"]
    assert "Test CPU" in intro and "1-minute load average 1.25" in intro
    assert "scripts/engines_concurrency.sh" in intro and "c.csv" in intro
    assert speedup["visible"] and tokens["color_map"] == {"plain": "#6b7280", "speculative": "#16a34a"}


def test_the_tabs_charts_in_traditional_chinese(tmp_path):
    path = write_csv(tmp_path / "c.csv", sweep_rows())
    intro, speedup, tokens = bench_ui.measured_charts("zh-TW", path)
    assert set(tokens["value"]["lane"]) == {"一般", "推測"} and set(tokens["color_map"]) == {"一般", "推測"}
    assert (speedup["title"], speedup["x_title"]) == ("加速比對並發請求數（實測）", "並發請求數")
    assert tokens["color_title"] == "路線" and "GPU 上的批次驗證" in intro


def test_a_missing_file_hides_the_charts_and_says_why(tmp_path):
    intro, speedup, tokens = bench_ui.measured_charts("en", tmp_path / "none.csv")
    assert intro.startswith("No measured concurrency sweep to draw:") and "none.csv" in intro
    assert speedup == tokens == {"visible": False}


def test_the_shipped_sweep_reads_with_levels_1_2_4_8():
    rows = eb.read_csv(bench_ui.MEASURED_SWEEP)
    assert [n for n, _ in eb.speedups(rows)] == [1, 2, 4, 8]
    assert all(r["cpu_model"] and r["load_before"] is not None for r in rows)


def test_the_written_sweep_names_the_machine_and_its_load(tmp_path):
    rows = sorted(sweep_rows(), key=lambda r: (r["lane"] != "plain", r["concurrency"]))
    meta = {"date": "2026-12-06 10:00 UTC", "note": "", "servers": {}, "tasks": ["chat"],
            "repeats": 3, "max_new_tokens": 64, "temperature": 0.0,
            "machine": {"cpu_model": "Test CPU", "cpu_cores_logical": 2}}
    paths = eb.write(rows, tmp_path, meta)
    report = paths["report"].read_text()
    assert ("Measured 2026-12-06 10:00 UTC, Test CPU (2 logical cores), 1-minute load average "
            "1.25 before, 17.50 after") in report
    assert eb.read_csv(paths["csv"])[-1]["load_after"] == 17.5
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
