"""Atomic checkpoints and the metrics files."""

from __future__ import annotations

import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsys import checkpoint, metrics
from fedsys_launch import recording


def test_checkpoint_roundtrip(tmp_path):
    p = tmp_path / "ck.pt"
    payload = {"round": 3, "params": {"w": np.arange(4, dtype=np.float32)}, "rng": checkpoint.rng_state()}
    checkpoint.save(p, payload)
    got = checkpoint.load(p)
    assert got["round"] == 3
    np.testing.assert_array_equal(got["params"]["w"], payload["params"]["w"])


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    p = tmp_path / "ck.pt"
    checkpoint.save(p, {"round": 1})

    def boom(obj, fh):
        fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(p, {"round": 2})
    monkeypatch.undo()
    assert checkpoint.load(p)["round"] == 1
    assert [f.name for f in tmp_path.iterdir()] == ["ck.pt"]  # no temporary file left


def test_rng_state_restores_global_generators():
    s = checkpoint.rng_state()
    a = (np.random.rand(), torch.rand(1).item())  # noqa: NPY002
    checkpoint.set_rng_state(s)
    assert (np.random.rand(), torch.rand(1).item()) == a  # noqa: NPY002


def test_metrics_files_and_summary(tmp_path):
    recs = [{"round": 0, "accuracy": 0.1}] + [
        {"round": r, "accuracy": 0.5 + 0.01 * r, "round-time": 2.0} for r in range(1, 13)]
    for r in recs:
        metrics.append_jsonl(tmp_path / "m.jsonl", r)
    assert metrics.read_jsonl(tmp_path / "m.jsonl") == recs
    metrics.write_csv(tmp_path / "m.csv", recs)
    assert (tmp_path / "m.csv").read_text().splitlines()[0] == "round,accuracy,round-time"
    s = metrics.summarise(recs)
    tail = [0.5 + 0.01 * r for r in range(3, 13)]
    assert s["rounds"] == 12 and s["final"] == pytest.approx(0.62) and s["best"] == pytest.approx(0.62)
    assert s["last_mean"] == pytest.approx(np.mean(tail)) and s["last_std"] == pytest.approx(np.std(tail))
    assert s["time_s"] == pytest.approx(24.0)
    table = metrics.results_table({"fedavg": recs, "empty": []})
    assert "| fedavg | 12 | 62.00 | 62.00 |" in table and "| empty | 0 |" in table
    png = metrics.plot_curves({"fedavg": recs}, tmp_path / "a.png", "t")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "| fedavg | 12 | 62.00 | 62.00 | 57.50 | 2.87 | - | - | 0 | 24 |" in table  # no work, no traffic


def test_work_traffic_and_hops_in_the_summary_the_table_and_the_curve(tmp_path):
    # a parallel method: 2 rounds of 3 clients (900 examples each), 1 MB models, 3 reached
    par = [{"round": 0, "accuracy": 0.1},
           {"round": 1, "accuracy": 0.5, "trained-examples": 2700, "bytes-down": 3e6,
            "bytes-up": 3e6, "clients-reached": 3, "round-time": 1.0},
           {"round": 2, "accuracy": 0.6, "trained-examples": 2700, "bytes-down": 6e6,
            "bytes-up": 6e6, "clients-reached": 3, "round-time": 1.0}]
    # a chain: 3 hops, a pool of 2 on each, the same 900-example clients
    chain = [{"round": 0, "accuracy": 0.1}] + [
        {"round": h, "hop": h, "accuracy": (3 + h) / 10, "trained-examples": 1800,
         "bytes-down": h * 1e6, "bytes-up": h * 1e6, "clients-reached": h} for h in (1, 2, 3)]
    s = metrics.summarise(par)
    assert (s["work"], s["bytes"], s["bytes_per_client"], s["hops"]) == (5400, 12e6, 4e6, 0)
    c = metrics.summarise(chain)
    assert (c["work"], c["bytes"], c["bytes_per_client"], c["hops"]) == (5400, 6e6, 2e6, 1)
    assert metrics.work_curve(chain) == [(0, 0.1), (1800, 0.4), (3600, 0.5), (5400, 0.6)]
    table = metrics.results_table({"fedavg": par, "fedseq": chain})
    assert "| fedavg | 2 | 60.00 | 60.00 | 55.00 | 5.00 | 5.4 | 4.0 | 0 | 2 |" in table
    assert "| fedseq | 3 hops | 60.00 | 60.00 | 50.00 | 8.16 | 5.4 | 2.0 | 0 | 0 |" in table
    # a tiny test run's work and traffic keep two digits instead of showing 0
    tiny = [{**r, "trained-examples": 30, "bytes-down": 6e3, "bytes-up": 6e3} for r in par]
    assert "| 0.09 | 0.004 |" in metrics.results_table({"tiny": tiny})
    # one-shot FedAvg: a warm-up hop, then a parallel round: rounds, not hops
    oneshot = [{"round": 0, "accuracy": 0.1}, {"round": 1, "hop": 1, "accuracy": 0.3},
               {"round": 2, "hop": 0, "accuracy": 0.5}]
    assert metrics.summarise(oneshot)["hops"] == 0
    # a chain evaluated once per pass: its hops are counted, not its evaluations
    per_pass = [{"round": 0, "accuracy": 0.1}] + [
        {"round": h, "hop": h, **({"accuracy": 0.5} if h == 3 else {})} for h in (1, 2, 3)]
    assert metrics.summary_cells(metrics.summarise(per_pass))[0] == "3 hops"
    page = metrics.results_page("default", "A demonstration schedule.", table)
    assert page.startswith("# default\n\nA demonstration schedule.\n\n| strategy |")
    assert page.rstrip().endswith("![test accuracy](accuracy.png)")
    assert metrics.plot_curves({"fedavg": par, "fedseq": chain}, tmp_path / "w.png",
                               "t").read_bytes()[:4] == b"\x89PNG"


def test_replace_section_keeps_the_document_order():
    doc = "# P\n\nintro\n\n## A\n\nold a\n\n### A1\n\nold a1\n\n## B\n\nb\n"
    got = recording.replace_section(doc, "### A1", "new a1")
    assert got == "# P\n\nintro\n\n## A\n\nold a\n\n### A1\n\nnew a1\n\n## B\n\nb\n"
    got = recording.replace_section(doc, "## A", "new a")  # a level-2 section takes its subsections
    assert got == "# P\n\nintro\n\n## A\n\nnew a\n\n## B\n\nb\n"
    assert recording.replace_section(doc, "## C", "c").endswith("## B\n\nb\n\n## C\n\nc\n")
    assert recording.replace_section(doc, "## B", "b2").endswith("## B\n\nb2\n")


def test_replace_subsection_places_new_subsections_under_their_parent():
    doc = "# P\n\n## A\n\nintro\n\n### A1\n\na1\n\n## B\n\nb\n"
    got = recording.replace_subsection(doc, "## A", "### A2", "a2")  # new: at the end of ## A
    assert got == "# P\n\n## A\n\nintro\n\n### A1\n\na1\n\n### A2\n\na2\n\n## B\n\nb\n"
    assert recording.replace_subsection(got, "## A", "### A1", "new") == got.replace("a1\n", "new\n", 1)
    assert recording.replace_subsection(doc, "## C", "### C1", "c1").endswith(
        "## B\n\nb\n\n## C\n\n### C1\n\nc1\n")
    deeper = "# P\n\n### A\n\nx\n\n## A\n\ny\n"  # "## A" must not match inside "### A"
    assert recording.replace_subsection(deeper, "## A", "### A1", "z") == (
        "# P\n\n### A\n\nx\n\n## A\n\ny\n\n### A1\n\nz\n")


def test_kept_records_are_copied_and_read_back_when_the_run_is_gone(tmp_path):
    runs, data = tmp_path / "runs", tmp_path / "data"
    for strat, acc in (("fedavg", 0.5), ("fedcda", 0.6)):
        (runs / "r" / strat).mkdir(parents=True)
        metrics.write_jsonl(runs / "r" / strat / "metrics.jsonl", [{"round": 1, "accuracy": acc}])
        assert recording.kept_records(runs, data, "r", strat) == [{"round": 1, "accuracy": acc}]
    metrics.write_jsonl(runs / "r" / "fedavg" / "metrics.jsonl", [{"round": 2, "accuracy": 0.7}])
    recording.kept_records(runs, data, "r", "fedavg")  # a newer run replaces its old copy
    shutil.rmtree(runs)
    assert recording.kept_records(runs, data, "r", "fedavg") == [
        {"round": 2, "accuracy": 0.7, "strategy": "fedavg"}]
    assert recording.kept_records(runs, data, "r", "fedcda")[0]["accuracy"] == 0.6
    assert recording.kept_records(runs, data, "missing", "fedavg") == []


# ---------------------------------------------------------------- broken files


def test_the_previous_checkpoint_is_kept_and_a_broken_latest_falls_back_to_it(tmp_path):
    from fedsys import checkpoint as ck

    path = tmp_path / "checkpoint.pt"
    ck.save(path, {"round": 1, "x": 1})
    assert not ck.prev_path(path).exists()
    ck.save(path, {"round": 2, "x": 2})
    assert ck.load(ck.prev_path(path))["round"] == 1 and ck.load(path)["round"] == 2
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])                       # truncated
    got, used, note = ck.load_latest(path)
    assert got["round"] == 1 and used == ck.prev_path(path)
    assert "truncated or corrupt" in note and "checkpoint.prev.pt (round 1)" in note
    ck.prev_path(path).write_bytes(b"\x00" * 64)                     # and the previous too
    with pytest.raises(ck.CheckpointError, match="cannot be resumed; start the run again"):
        ck.load_latest(path)


def test_a_bit_flipped_in_a_checkpoint_is_corrupt_and_the_previous_one_is_used(tmp_path):
    from fedsys import checkpoint as ck

    path = tmp_path / "checkpoint.pt"
    w = np.linspace(-1, 1, 4096, dtype=np.float32)
    ck.save(path, {"round": 1, "params": {"w": w}})
    ck.save(path, {"round": 2, "params": {"w": w + 1}})
    with zipfile.ZipFile(path) as z:                                 # its largest part:
        part = max(z.infolist(), key=lambda i: i.file_size)          # the pickled weights
    raw = bytearray(path.read_bytes())
    n, extra = struct.unpack("<HH", raw[part.header_offset + 26:part.header_offset + 30])
    raw[part.header_offset + 30 + n + extra + part.file_size // 2] ^= 0x04  # one bit
    path.write_bytes(bytes(raw))
    try:  # torch.load alone reads other weights without a word, or fails on the pickle
        alone = torch.load(path, weights_only=False)["params"]["w"]
    except Exception:
        alone = None
    assert alone is None or not np.array_equal(alone, w + 1)
    with pytest.raises(ck.CheckpointError, match=r"checkpoint\.pt is corrupt \(its part "
                                                 r"'.+' fails the CRC-32 it was written with\)"):
        ck.load(path)
    got, used, note = ck.load_latest(path)
    assert got["round"] == 1 and used == ck.prev_path(path) and "fails the CRC-32" in note
    np.testing.assert_array_equal(got["params"]["w"], w)


def test_a_checkpoint_of_another_format_is_refused_with_the_versions_named(tmp_path):
    import torch

    from fedsys import checkpoint as ck

    path = tmp_path / "checkpoint.pt"
    torch.save({"round": 3, "format": 99, "fedsys": "9.0"}, path)
    with pytest.raises(ck.CheckpointError, match=r"fedsys 9\.0 \(checkpoint format 99\).*"
                                                 r"reads format 2$"):
        ck.load(path)
    torch.save({"round": 3}, path)                                   # no format: not read
    with pytest.raises(ck.CheckpointError, match=r"fedsys \? \(checkpoint format none\)"):
        ck.load(path)
    torch.save([1, 2], path)
    with pytest.raises(ck.CheckpointError, match="not a fedsys checkpoint"):
        ck.load(path)


def test_a_run_config_that_was_truncated_or_edited_is_refused(tmp_path):
    from fedsys.config import ConfigError, verify_saved
    from fedsys_launch.config_schema import build

    path = tmp_path / "config.yaml"
    build({"dataset": "synthetic", "model": "mlp", "num-clients": 3,
           "clients-per-round": 3}).save(path)
    verify_saved(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match="truncated or was edited"):
        verify_saved(path)
    path.write_text(text.replace("num-clients: 3", "num-clients: 4"))
    with pytest.raises(ConfigError, match="truncated or was edited"):
        verify_saved(path)
    path.write_text(text.split("\n", 1)[1])                          # written before the line
    verify_saved(path)


def test_verdict_is_a_paired_one_sided_t_test_each_way():
    # t = mean / (sd / sqrt(n)); n = 3 needs |t| >= 2.920 (t-table, df 2, one-sided 95 %)
    assert metrics.verdict([1.0, 2.0, 3.0]) == "holds"            # t = 3.46
    assert metrics.verdict([-1.0, -2.0, -3.0]) == "does not hold here"
    # unseparated: the mean's sign is said, a loss is never "holds"
    assert metrics.verdict([0.5, 2.0, 3.5]) == "within noise, mean for"  # t = 2.31
    assert metrics.verdict([-0.5, -2.0, -3.5]) == "within noise, mean against"
    assert metrics.verdict([1.0, -1.0, 0.5]) == "within noise, mean for"  # mean +0.17
    assert metrics.verdict([-1.0, 1.0, -0.5]) == "within noise, mean against"
    assert metrics.verdict([1.0, -1.0]) == "within noise"             # mean exactly 0
    # n = 2 (df 1) needs t >= 6.314: 1.0 and 1.2 give t = 11, 1.0 and 3.0 give t = 2
    assert metrics.verdict([1.0, 1.2]) == "holds"
    assert metrics.verdict([1.0, 3.0]) == "within noise, mean for"
    assert metrics.verdict([0.4, 0.4, 0.4]) == "holds"             # no spread: the sign
    assert metrics.verdict([-0.4, -0.4]) == "does not hold here"
    assert metrics.verdict([0.0, 0.0]) == "within noise"
    assert metrics.verdict([5.0]) == "one seed: no verdict"
    # 25 seeds (df 24, t-table 1.711): t = 1.70 is short of it, t = 1.72 above it
    z = np.linspace(-1.0, 1.0, 25)
    diffs = 0.340 + z / z.std(ddof=1)
    assert metrics.verdict(list(diffs)) == "within noise, mean for"
    assert metrics.verdict(list(-diffs)) == "within noise, mean against"
    assert metrics.verdict(list(diffs + 0.004)) == "holds"  # t = 1.72
    assert metrics.verdict(list(-diffs - 0.004)) == "does not hold here"


def _pixels(png: Path, colour: str) -> int:
    import matplotlib.image as mpimg

    img = mpimg.imread(png)[..., :3]
    rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img - rgb).max(-1) < 0.08).sum())


def test_two_methods_with_the_same_numbers_both_show_in_the_figures(tmp_path):
    # FedProx at a small mu equals FedAvg to the plotted precision: with solid lines the
    # later curve covered the earlier (only its legend entry showed: 52 pixels against 1327)
    recs = [{"round": r, "accuracy": 0.5 + 0.004 * r} for r in range(61)]
    first, second = "#1f77b4", "#ff7f0e"  # matplotlib's first two cycle colours
    for png in (metrics.plot_curves({"fedavg": recs, "fedprox": recs}, tmp_path / "a.png", "t"),
                metrics.plot_seed_curves({"fedavg": {0: recs, 1: recs}, "fedprox": {0: recs, 1: recs}},
                                         tmp_path / "s.png", "t")):
        assert _pixels(png, first) > 0.25 * _pixels(png, second), png.name


def test_seed_curves_draw_the_named_key_and_leave_out_strategies_without_it(tmp_path):
    # the seeded pages plot the FedCDA mechanism (train-loss, global-step) the same way as
    # accuracy: a strategy that never reports the key draws nothing, the others do, each in
    # its own colour (the one it has in the setting's accuracy figure); drawing accuracy
    # instead would put both in the figure
    loss = [{"round": r, "accuracy": 0.5, "train-loss": 1.0 / (r + 1)} for r in range(1, 31)]
    no_loss = [{"round": r, "accuracy": 0.5} for r in range(1, 31)]
    first, second = "#1f77b4", "#ff7f0e"
    png = metrics.plot_seed_curves({"a": {0: no_loss, 1: no_loss}, "b": {0: loss, 1: loss}},
                                   tmp_path / "l.png", "t", key="train-loss", scale=1.0,
                                   ylabel="training loss")
    assert _pixels(png, first) == 0
    assert _pixels(png, second) > 200


def test_record_section_stamps_command_and_machine_and_keeps_the_order(tmp_path):
    import os
    import platform
    import time

    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## A\n\nold a\n\n## B\n\nb\n")
    recording.record_section(doc, "## A", "python benchmarks/x.py --pairs 2", "| t |\n")
    lines = doc.read_text().split("\n")
    assert lines[:3] == ["# Performance", "", "## A"]
    assert lines[4] == "Command: `python benchmarks/x.py --pairs 2`  "
    assert lines[5] == (f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
                        f"{time.strftime('%Y-%m-%d')}")
    assert lines[7] == "| t |" and "old a" not in doc.read_text()
    assert doc.read_text().endswith("## B\n\nb\n")


def test_record_section_puts_details_before_the_date_and_adds_a_missing_section(tmp_path):
    import os
    import platform
    import time

    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## A\n\na\n")
    recording.record_section(doc, "## C", "python benchmarks/y.py", "| u |\n", "torch 9.9", "1 thread")
    text = doc.read_text()
    assert text.startswith("# Performance\n\n## A\n\na\n")
    assert (f"## C\n\nCommand: `python benchmarks/y.py`  \nMachine: {platform.machine()}, "
            f"{os.cpu_count()} cores, torch 9.9, 1 thread, {time.strftime('%Y-%m-%d')}\n\n| u |\n") in text
    assert text.count("## C") == 1
    recording.record_section(doc, "## C", "python benchmarks/y.py", "| v |\n")
    assert doc.read_text().count("## C") == 1 and "| u |" not in doc.read_text()


def test_refused_replies_are_counted_in_the_run_table_and_over_seeds():
    """A run whose rounds refused replies says so at the end: the sum of every round's
    ``clients-rejected`` in the results table, and over seeds the sum of every seed's."""
    def run(bad: dict[int, int]) -> list[dict]:
        return [{"round": 0, "accuracy": 0.1}] + [
            {"round": r, "accuracy": 0.5, "clients-ok": 4 - bad.get(r, 0),
             "clients-rejected": bad.get(r, 0), "round-time": 1.0} for r in (1, 2, 3)]

    clean, hit = run({}), run({2: 1, 3: 4})
    assert metrics.summarise(clean)["refused"] == 0 and metrics.summarise(hit)["refused"] == 5
    cols = metrics.table_columns()
    assert cols[cols.index("refused replies") + 1] == "time s"
    table = metrics.results_table({"clean": clean, "hit": hit})
    assert "| 0 | 3 |" in table.split("| clean |")[1].splitlines()[0]
    assert "| 5 | 3 |" in table.split("| hit |")[1].splitlines()[0]
    assert "Refused replies" in metrics.COLUMNS_NOTE
    over = metrics.seeds_results_table({"hit": {0: hit, 1: clean, 2: hit}, "none": {}})
    head = over.splitlines()[0]
    assert head.endswith("| refused replies |") and head.count("|") == len(metrics.seeds_columns()) + 1
    assert over.split("| hit |")[1].splitlines()[0].endswith("| 10 |")
    assert "| none | 0 | 0 | - | - | - | - | - |" in over
    assert metrics.seeds_summary({0: hit, 1: clean})["refused"] == 5


def test_write_subsection_replaces_one_subsection_in_place(tmp_path, capsys):
    doc = tmp_path / "performance.md"
    doc.write_text("# P\n\n## S\n\n### a\n\nold\n\n### b\n\nkeep\n\n## T\n\nt\n")
    recording.write_subsection(doc, "## S", "### a", "new\n")
    text = doc.read_text()
    assert "old" not in text and text.index("new") < text.index("### b") < text.index("## T")
    assert "keep" in text and f"recorded in {doc}" in capsys.readouterr().out


def test_a_torn_last_record_is_dropped_and_any_other_bad_line_named(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "acc')      # an append cut short
    assert metrics.read_jsonl(f) == [{"round": 1}, {"round": 2}]
    f.write_text('{"round": 1}\n{"round": 2\n{"round": 3}\n')        # line 2 spoilt
    with pytest.raises(metrics.MetricsFileError, match=r"m\.jsonl line 2 is not a JSON record"):
        metrics.read_jsonl(f)
    f.write_text('{"round": 1}\n{"round": 3, "acc\n')                  # torn, then a newline
    with pytest.raises(metrics.MetricsFileError, match="line 2"):
        metrics.read_jsonl(f)
    f.write_text('{"round": 1}\n[1, 2]\n')
    with pytest.raises(metrics.MetricsFileError, match="line 2 is not a JSON object"):
        metrics.read_jsonl(f)
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(metrics.MetricsFileError, match="not a text file"):
        metrics.read_jsonl(f)


def test_compare_names_a_spoilt_metrics_line_and_run_refuses_empty_seeds(tmp_path, capsys):
    from fedsys_launch.commands.cli import main

    (tmp_path / "r" / "fedavg").mkdir(parents=True)
    (tmp_path / "r" / "fedavg" / "metrics.jsonl").write_text('{"round": 0\n{"round": 1}\n')
    assert main(["compare", str(tmp_path / "r")]) == 2
    assert "metrics.jsonl line 1 is not a JSON record" in capsys.readouterr().err
    for given in ("", ",", " , "):
        assert main(["run", "configs/default.yaml", "--seeds", given]) == 2
        assert "names no seed" in capsys.readouterr().err


def test_a_long_plot_title_is_broken_into_lines_a_short_one_kept():
    """Titles past 80 characters were cut off at the figure's edges (the results pages'
    long setting names): broken at spaces into lines of at most 80, words kept."""
    from fedsys.metrics import fit_title

    short = "2 label shards (`partition: shards`), FedAvg"
    assert fit_title(short) == short
    long = ("Dirichlet 0.3 (`partition: dirichlet-balanced`), the paper's local work: 20 "
            "epochs at lr 1e-3, 30 rounds, warmup 7")
    lines = fit_title(long).split("\n")
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines)
    assert " ".join(lines) == long
