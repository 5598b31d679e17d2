"""--fail-if: the grammar, every malformed form as one line, and evaluation on summaries."""

import inspect
import re
from pathlib import Path

import pytest
from testkit import make_profile

from libreyolo.errors import ConfigError
from libreyolo.profiler import gates as G
from libreyolo.profiler import verdict
from libreyolo.profiler.artifacts import summary
from libreyolo.profiler.repeat import aggregate

FIGS = summary(make_profile())  # step_ms_mean 16.0, utilisation 0.25, verdict launch-bound, batch 8


def holds(text: str, figures=FIGS, a=None) -> bool:
    """Whether the gate fails the command (its expression holds)."""
    return G.failure([G.parse(text, compare=a is not None)], figures, a) is not None


def test_fields_are_the_summary_keys():
    assert set(G.FIELDS) == set(FIGS) - {"schema", "schema_version"}
    assert set(G.ALIASES.values()) <= set(G.FIELDS)
    names = set(re.findall(r'"name": "([a-z-]+)"', inspect.getsource(verdict)))  # the verdict and its helpers
    assert names == set(G.VERDICTS)


def test_every_operator_below_at_and_above_the_figure():
    truth = {"<": [17], "<=": [16, 17], ">": [15], ">=": [15, 16], "==": [16], "!=": [15, 17]}  # step is 16.0
    assert set(truth) == set(G.OPS)
    for op in G.OPS:
        for bound in (15, 16, 17):
            assert holds(f"step_ms_mean{op}{bound}") is (bound in truth[op]), (op, bound)
            assert holds(f"step_ms_mean {op} {bound}.0") is (bound in truth[op]), (op, bound)


def test_parse_aliases_numbers_and_words():
    g = G.parse("  step_ms >= 1e1 ")
    assert (g.text, g.field, g.op, g.value, g.factor) == ("step_ms >= 1e1", "step_ms_mean", ">=", 10.0, None)
    for alias, field in G.ALIASES.items():
        assert G.parse(f"{alias}<1").field == field
    for raw, value in (("-1", -1.0), ("+.5", 0.5), ("2.", 2.0), ("3E-2", 0.03)):
        assert G.parse(f"data_wait_ms>{raw}").value == value
    assert G.parse("verdict!=compute-bound").value == "compute-bound"
    assert G.parse("verdict=='host-bound'").value == G.parse('verdict=="host-bound"').value == "host-bound"
    assert G.parse("device==NVIDIA H200").value == "NVIDIA H200"
    assert G.parse("mode==infer").value == "infer"
    assert G.parse("cuda_graph==TRUE").value is True and G.parse("cuda_graph!=false").value is False
    assert holds("verdict==launch-bound") and not holds("verdict!=launch-bound")
    assert holds("cuda_graph==false") and holds("batch==8") and holds("precision!=float32")


def test_a_and_multiples_of_a_in_compare():
    a, b = summary(make_profile()), {**FIGS, "step_ms_mean": 17.0, "verdict": "host-bound"}
    assert G.parse("step_ms>1.05*A", compare=True) == G.Gate("step_ms>1.05*A", "step_ms_mean", ">", None, 1.05)
    assert G.parse("step_ms > 2 * A", compare=True).factor == 2.0
    assert G.parse("verdict!=A", compare=True).factor == 1.0
    assert holds("step_ms>1.05*A", b, a) and not holds("step_ms>1.1*A", b, a)
    assert holds("step_ms>A", b, a) and holds("verdict!=A", b, a) and not holds("verdict==A", b, a)
    line = G.failure([G.parse("step_ms>1.05*A", compare=True)], b, a, name="B")
    assert line == "gate failed: step_ms>1.05*A (B's step_ms_mean is 17; A's is 16, so 1.05*A is 16.8)"
    assert G.failure([G.parse("verdict!=A", compare=True)], b, a, name="B") == (
        "gate failed: verdict!=A (B's verdict is host-bound; A's is launch-bound)")
    assert G.failure([G.parse("utilisation<0.7", compare=True)], b, a, name="B") == (
        "gate failed: utilisation<0.7 (B's utilisation is 0.25)")


MALFORMED = {
    "": "--fail-if '': empty; write FIELD OP VALUE",
    "   ": "--fail-if '': empty",
    "0.7>utilisation": "no field name first",
    "utilisation": "no comparison after 'utilisation' (use one of < <= > >= == !=)",
    "utilisation 0.7": "no comparison after 'utilisation'",
    "step_ms=20": "unknown operator '=' ('=' alone: write '==')",
    "step_ms=>20": "unknown operator '=>'",
    "step_ms<>20": "unknown operator '<>'",
    "step_ms!20": "unknown operator '!'",
    "utilisatoin<0.7": "unknown field 'utilisatoin' (did you mean 'utilisation'?)",
    "speed<3": "unknown field 'speed' (fields: the keys of profile_summary.json: step_ms_mean,",
    "schema==x": "unknown field 'schema'",
    "step_ms<": "no value after '<'",
    "step_ms<fast": "'fast' is not a number (step_ms_mean is one)",
    "step_ms<1,5": "'1,5' is not a number",
    "step_ms<nan": "'nan' is not a number",
    "step_ms<1e999": "'1e999' is not a number",
    "step_ms<0.7 and syncs<1": "'0.7 and syncs<1' is not a number",
    "verdict<compute-bound": "verdict is compared with == or != only",
    "verdict==compute-bond": "unknown verdict 'compute-bond' (one of compute-bound, dataloader-bound, host-bound, "
                             "launch-bound, memory-bound)",
    "mode==val": "unknown mode 'val' (one of train, infer)",
    "cuda_graph==yes": "'yes' is not true or false",
    "cuda_graph>false": "cuda_graph is compared with == or != only",
    "step_ms>1.05*A": "'A' is the first profile of 'profile compare A B'; a 'profile summary' gate takes a value",
    "step_ms>A": "'A' is the first profile of 'profile compare A B'",
}


@pytest.mark.parametrize("text", list(MALFORMED))
def test_malformed_gates_are_one_line(text):
    with pytest.raises(ConfigError) as exc:
        G.parse_all(["utilisation<0.7", text])
    message = str(exc.value)
    assert MALFORMED[text] in message and "\n" not in message
    if text.strip():
        assert message.startswith(f"--fail-if '{text.strip()}': ")


def test_malformed_only_in_compare():
    for text, message in {"verdict==2*A": "'2*A' multiplies a number and verdict is not one (write verdict==A)",
                          "step_ms>1e999*A": "'1e999' is not a number", "step_ms>A*2": "'A*2' is not a number",
                          "step_ms>1.05*B": "'1.05*B' is not a number"}.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            G.parse(text, compare=True)


def test_figures_a_gate_cannot_check():
    cases = [("overhead_frac>0.1", {**FIGS, "overhead_frac": None},
              "gate 'overhead_frac>0.1' cannot be checked: the profile's overhead_frac is null (not measured in "
              "that window); drop the gate or measure it"),
             ("utilisation<0.7", {**FIGS, "utilisation": "high"}, "the profile's utilisation is 'high', not a number"),
             ("batch==8", {**FIGS, "batch": True}, "the profile's batch is True, not a number"),
             ("cuda_graph==true", {**FIGS, "cuda_graph": 1}, "the profile's cuda_graph is 1, not a boolean"),
             ("lever==x", {k: v for k, v in FIGS.items() if k != "lever"}, "gate 'lever==x': the profile has no lever")]
    for text, figures, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            G.failure([G.parse(text)], figures)
    with pytest.raises(ConfigError, match="A's step_ms_mean is null"):
        G.failure([G.parse("step_ms>A", compare=True)], FIGS, {**FIGS, "step_ms_mean": None}, name="B")


def test_first_failed_gate_is_named():
    gates = G.parse_all(["syncs_per_step>=1", "utilisation<0.7", "verdict==launch-bound"])
    assert G.failure(gates, FIGS) == "gate failed: utilisation<0.7 (utilisation is 0.25)"
    assert G.failure(gates[:1], FIGS) is None and G.failure([], FIGS) is None


def test_a_repeat_aggregate_gates_on_the_means():
    s1, s2 = summary(make_profile()), {**summary(make_profile()), "step_ms_mean": 20.0, "verdict": "host-bound"}
    rep = aggregate([s1, s2, s1], [Path("p1"), Path("p2"), Path("p3")])
    figures, notes = G.repeat_figures(rep)
    assert figures["step_ms_mean"] == pytest.approx(52 / 3) and figures["verdict"] == "launch-bound"
    assert figures["batch"] == 8 and "precision" not in figures
    gates = G.parse_all(["step_ms>17"])
    assert G.failure(gates, figures, notes=notes) == "gate failed: step_ms>17 (step_ms_mean is 17.33, the mean of 3 trials)"
    assert G.failure(G.parse_all(["verdict==launch-bound"]), figures, notes=notes) == (
        "gate failed: verdict==launch-bound (verdict is launch-bound, the verdict of 2 of 3 trials)")
    with pytest.raises(ConfigError, match="gate 'precision==x': the --repeat aggregate has no precision"):
        G.failure(G.parse_all(["precision==x"]), figures, name="the --repeat aggregate")
