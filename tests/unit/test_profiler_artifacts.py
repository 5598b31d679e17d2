"""profile.json schema checks, atomic writes, trace annotation, the report and the timeline page."""

import copy
import io
import json

import pytest
from testkit import CHROMIUM, KERNEL, NEEDS_CHROMIUM, chromium_render, ink, make_profile

from libreyolo.atomic import write_json_atomic
from libreyolo.errors import ProfileFormatError
from libreyolo.profiler import artifacts
from libreyolo.profiler.repeat import aggregate
from libreyolo.profiler.report import print_repeat, print_report
from libreyolo.profiler.timeline import gantt_events, render


def test_write_all_and_load_back(tmp_path):
    profile = make_profile()
    profile["headline"]["overhead_frac"] = float("nan")  # JSON has no NaN: written as null
    written = artifacts.write_all(tmp_path, profile, {"traceEvents": []}, "<html></html>")
    assert sorted(p.name for p in written) == sorted(artifacts.FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(artifacts.FILES)  # no temp files left
    loaded = artifacts.load_profile(tmp_path)
    assert loaded == artifacts.load_profile(tmp_path / "profile.json")
    assert loaded["headline"]["overhead_frac"] is None
    summary = json.loads((tmp_path / "profile_summary.json").read_text())
    assert summary["schema"] == artifacts.SUMMARY_SCHEMA
    assert set(artifacts.SUMMARY_KEYS) <= set(summary) and summary["verdict"] == "launch-bound"
    assert summary["lever"].startswith("cuda_graph=True")


def _bad_files():
    good = json.dumps(make_profile(), indent=1)
    newer = {**make_profile(), "schema_version": artifacts.SCHEMA_VERSION + 1}
    no_verdict = {k: v for k, v in make_profile().items() if k != "verdict"}
    bad_phases = {**make_profile(), "phases": "forward"}
    return {
        "malformed": ("{not json", "is not valid JSON"),
        "truncated": (good[: len(good) // 2], "is not valid JSON (truncated or corrupt?)"),
        "foreign": (json.dumps({"traceEvents": []}), "is not a LibreYOLO profile"),
        "a list": ("[1, 2]", "is not a LibreYOLO profile"),
        "a summary": (json.dumps({"schema": artifacts.SUMMARY_SCHEMA}), "is a profile summary"),
        "newer": (json.dumps(newer), f"uses profile schema version {artifacts.SCHEMA_VERSION + 1}; this libreyolo"),
        "string version": (json.dumps({**make_profile(), "schema_version": "1"}), "invalid schema_version"),
        "no verdict": (json.dumps(no_verdict), "missing or malformed verdict"),
        "bad phases": (json.dumps(bad_phases), "missing or malformed phases"),
        "binary": (b"\xff\xfe\x00garbage", "cannot read"),
    }


def _edited(edit) -> str:
    profile = make_profile()
    edit(profile)
    return json.dumps(profile)


# Right schema and version, wrong inner types: each is named by its path in the document.
INNER = {
    "headline string": (lambda p: p["headline"].update(step_ms_mean="fast"),
                        'headline.step_ms_mean is "fast", not a number or null'),
    "kernel row without name": (lambda p: p["kernels"]["rows"][1].pop("name"), "kernels.rows[1].name is missing"),
    "kernel count float": (lambda p: p["kernels"]["rows"][0].update(count=1.5), "kernels.rows[0].count is 1.5, not an integer"),
    "kernel share null": (lambda p: p["kernels"]["rows"][0].update(share=None), "kernels.rows[0].share is null, not a number"),
    "phase host list": (lambda p: p["phases"][2].update(host_ms=[1]), "phases[2].host_ms is [1], not a number or null"),
    "phase row a string": (lambda p: p["phases"].__setitem__(0, "forward"), 'phases[0] is "forward", not an object'),
    "verdict reason number": (lambda p: p["verdict"].update(reason=3), "verdict.reason is 3, not a string"),
    "cuda_graph string": (lambda p: p["run"].update(cuda_graph="on"), 'run.cuda_graph is "on", not an object or null'),
    "overhead note number": (lambda p: p["overhead"].update(fraction=None, note=7), "overhead.note is 7, not a string"),
    "rows not a list": (lambda p: p["kernels"].update(rows={"a": 1}), 'kernels.rows is {"a": 1}, not a list'),
    "a bool count": (lambda p: p["kernels"]["rows"][0].update(count=True), "kernels.rows[0].count is true, not an integer"),
}


@pytest.mark.parametrize("case", list(INNER))
def test_inner_types_are_checked_before_any_reader(tmp_path, case):
    edit, expected = INNER[case]
    path = tmp_path / "profile.json"
    path.write_text(_edited(edit))
    with pytest.raises(ProfileFormatError) as err:
        artifacts.load_profile(path)
    assert str(err.value) == f"'{path}' is incomplete or edited: {expected}"


@pytest.mark.parametrize("case", list(_bad_files()))
def test_unusable_profiles_are_one_line_errors(tmp_path, case):
    text, expected = _bad_files()[case]
    path = tmp_path / "profile.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ProfileFormatError) as err:
        artifacts.load_profile(path)
    message = str(err.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_missing_profile(tmp_path):
    with pytest.raises(ProfileFormatError, match="no profile at"):
        artifacts.load_profile(tmp_path)
    with pytest.raises(ProfileFormatError, match="no profile at"):
        artifacts.load_profile(tmp_path / "nope.json")


def test_annotate_trace_nests_steps_and_phases_with_profiler_slices():
    tid = 11
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": 98.0, "dur": 4.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": 149.0, "dur": 2.0},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 99.0, "dur": 100.0}],
        "distributedInfo": {"rank": 3}}
    steps = [{"iteration": 5, "epoch": 0, "half": 1, "wall_ms": 0.1, "ts": 50.0, "end": 100.0,  # ends inside a launch
              "phases": [{"name": "data", "ts": 50.0, "end": 60.0}, {"name": "forward", "ts": 60.0, "end": 100.0}]},
             {"iteration": 6, "epoch": 0, "half": 2, "wall_ms": 0.1, "ts": 100.0, "end": 150.5,
              "phases": [{"name": "data", "ts": 100.0, "end": 100.0}, {"name": "forward", "ts": 100.0, "end": 150.5}]}]
    artifacts.annotate_trace(trace, steps, pid=1, tid=tid)
    mine = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    # 100 sits mid-launch [98, 102]: a tie goes to the start; 150.5 in [149, 151] goes to the end
    assert [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in mine] == [
        ("ProfilerStep#5", 50.0, 98.0), ("data", 50.0, 60.0), ("forward", 60.0, 98.0),
        ("ProfilerStep#6", 98.0, 151.0), ("forward", 98.0, 151.0)]  # the empty `data` is left out
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"] == [
        "libreyolo half 1 (unsynchronised: verdict, utilisation)", "libreyolo half 2 (synchronised per phase: composition)"]
    assert trace["distributedInfo"] == {"rank": 3}  # an existing rank is kept


def test_timeline_is_self_contained_and_escapes_names():
    profile = make_profile()
    gantt = [{"row": "stream 7", "name": KERNEL, "start_ms": 0.0, "dur_ms": 0.5},
             {"row": "phases", "name": "forward", "start_ms": 0.0, "dur_ms": 6.0}]
    page = render(profile, gantt)
    assert page.startswith("<!DOCTYPE html>") and "launch-bound" in page
    assert "<script src=" not in page and "plotly" in page.lower()  # plotly.js inlined, nothing fetched
    assert "AddFunctor<float>" not in page and "AddFunctor&lt;float&gt;" in page
    assert "[clone]</script>" not in page and page.count("</script>") == page.count("<script")
    assert "cuda_graph=True" in page


@pytest.mark.skipif(CHROMIUM is None, reason=NEEDS_CHROMIUM)
def test_timeline_renders_in_headless_chromium(tmp_path):
    profile = make_profile()
    gantt = [{"row": "stream 7", "name": KERNEL, "start_ms": 0.0, "dur_ms": 0.5},
             {"row": "phases", "name": "forward", "start_ms": 0.0, "dur_ms": 6.0}]
    page = tmp_path / "timeline.html"
    html = render(profile, gantt)
    page.write_text(html)
    dom, shot = chromium_render(page, tmp_path)
    # plotly drew every figure from the inlined script (no network), and the verdict banner is there
    assert dom.count('class="main-svg"') >= html.count("Plotly.newPlot") >= 1
    assert "launch-bound" in dom
    inked, colours = ink(shot)
    assert inked > 0.05 and colours > 20, (inked, colours)


def test_gantt_shows_the_first_two_steps_kernels_by_stream_and_phases():
    def kernel(i, launch, start, stream):
        return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": launch, "dur": 2,
                 "args": {"correlation": i}},
                {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": stream, "ts": start, "dur": 5,
                 "args": {"device": 0, "stream": stream, "correlation": i}}]

    trace = {"traceEvents": kernel(1, 10, 20, 7) + kernel(2, 110, 150, 8) + kernel(3, 210, 230, 7)}
    steps = [{"half": 1, "ts": 100.0 * i, "cpu_end": 100.0 * (i + 1), "end": 100.0 * (i + 1),
              "phases": [{"name": "forward", "ts": 100.0 * i, "end": 100.0 * i + 50}]} for i in range(3)]
    rows = gantt_events(trace, steps, cuda=True, tid=1)
    assert [(r["row"], r["name"], r["start_ms"]) for r in rows] == [
        ("stream 7", "k1", 0.02), ("stream 8", "k2", 0.15), ("phases", "forward", 0.0), ("phases", "forward", 0.1)]


def test_plain_report_when_not_a_terminal():
    out = io.StringIO()
    print_report(make_profile(), file=out)
    text = out.getvalue()
    assert "\x1b[" not in text  # no colour codes in a pipe or log file
    assert "verdict: launch-bound: GPU busy 25%" in text and "lever: cuda_graph=True" in text
    assert "step 16.0 ± 0.5 ms" in text and "syncs/step 0.10" in text and "kernel busy 4.0 ms" in text
    assert "host ms (unsynced)" in text and "sm90_xmma_gemm [x]" in text  # brackets are data, not markup
    out = io.StringIO()
    print_report(make_profile(), file=out, sections=("kernels",), top=1)
    assert "sm90_xmma_gemm" not in out.getvalue() and "vectorized_elementwise_kernel<4" in out.getvalue()
    detr = make_profile()  # a DETR step's syncs are the model's own (model.host_syncs): the line says so
    detr["headline"]["syncs_per_step"], detr["utilisation"]["designed_syncs_per_step"] = 3.1, 3.0
    out = io.StringIO()
    print_report(detr, file=out)
    assert "syncs/step 3.10 (3 by design)" in out.getvalue()


def test_repeat_aggregate_and_report():
    a = artifacts.summary(make_profile())
    b = copy.deepcopy(a)
    b.update(step_ms_mean=18.0, verdict="host-bound", overhead_frac=None)
    c = {**a, "step_ms_mean": 17.0}
    rep = aggregate([a, b, c], ["p1", "p2", "p3"])
    assert rep["trials"] == 3 and rep["verdicts"] == ["launch-bound", "host-bound", "launch-bound"]
    assert (rep["verdict"], rep["verdict_count"]) == ("launch-bound", 2)
    assert rep["figures"]["step_ms_mean"]["mean"] == pytest.approx(17.0)
    assert rep["figures"]["step_ms_mean"]["std"] == pytest.approx(1.0)
    assert rep["figures"]["overhead_frac"]["values"] == [0.05, None, 0.05]
    assert rep["figures"]["overhead_frac"]["mean"] == pytest.approx(0.05)
    out = io.StringIO()
    print_repeat(rep, file=out)
    lines = out.getvalue().splitlines()
    assert ["step_ms_mean", "17", "1", "16,", "18,", "17"] in [line.split() for line in lines]
    assert "verdict: launch-bound (2 of 3 trials)" in lines


@pytest.mark.parametrize("overhead, expected", [
    ({"fraction": None, "note": "needs profile_skip >= 3"}, "profiler overhead on measured steps: n/a (needs profile_skip >= 3)"),
    ({"fraction": -0.857, "reference_ms": [70.0, 100.0, 130.0], "profiled_ms": [14.3, 14.3]},
     "profiler overhead on measured steps: -85.7% (median of 2 profiled against 3 unprofiled steps, which spread 60%); "
     "negative: profiling cannot speed a step up, so the unprofiled steps were slower (warm-up, a busy machine); "
     "read it as no measurable overhead; profile_skip=7 or more gives a steadier figure"),
    ({"fraction": 0.162, "reference_ms": [10.0, 9.0, 11.0, 10.0, 12.0, 8.0], "profiled_ms": [11.6] * 4},
     "profiler overhead on measured steps: +16.2% (median of 4 profiled against 6 unprofiled steps, which spread 40%); "
     "within the unprofiled steps' own spread"),
    ({"fraction": 4.17, "reference_ms": [10.0] * 6, "profiled_ms": [51.7] * 9},
     "profiler overhead on measured steps: +417.0% (median of 9 profiled against 6 unprofiled steps, which spread 0%)"),
])
def test_the_overhead_says_what_it_rests_on(overhead, expected):
    from libreyolo.profiler.report import overhead_line

    assert overhead_line(overhead) == expected


def test_a_copy_says_where_it_was_read_from(tmp_path):
    from libreyolo.profiler.report import where_line

    profile = make_profile()  # recorded run_dir: runs/profile/prof
    assert where_line(profile) == "artifacts in runs/profile/prof"
    assert where_line(profile, tmp_path) == f"read from {tmp_path}; the run wrote its artifacts in runs/profile/prof"


def test_summary_reads_a_repeat_aggregate_and_refuses_a_damaged_one(tmp_path):
    a = artifacts.summary(make_profile())
    rep = aggregate([a, {**a, "step_ms_mean": 18.0}], ["p/prof_1", "p/prof_2"])
    write_json_atomic(tmp_path / artifacts.REPEAT_FILE, rep)
    assert artifacts.load_for_summary(tmp_path) == ("repeat", rep)
    (tmp_path / "copy.json").write_text(json.dumps(rep))  # found by its schema, whatever its name
    assert artifacts.load_for_summary(tmp_path / "copy.json") == ("repeat", rep)
    with pytest.raises(ProfileFormatError, match="holds the trials of a --repeat run"):
        artifacts.load_profile(tmp_path)
    with pytest.raises(ProfileFormatError, match="is the aggregate of a --repeat run"):
        artifacts.load_profile(tmp_path / "copy.json")
    bad = copy.deepcopy(rep)
    bad["figures"]["step_ms_mean"]["values"] = ["fast", 18.0]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileFormatError, match=r"figures.step_ms_mean.values\[0\] is \"fast\", not a number"):
        artifacts.load_for_summary(tmp_path / "bad.json")
