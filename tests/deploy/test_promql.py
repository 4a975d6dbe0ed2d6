"""Every PromQL the project ships parses with `promql-parser` (PyPI; a port of Prometheus' own
parser, which checks function names, argument types and each matcher's regex): the dashboard's
panel queries (opt-in fields' too) and variable queries, and every rule's expression.

Grafana's variables are interpolated first, as Grafana does for a Prometheus data source: each
variable at "All" (its custom all value, `.*`) and at two chosen values (values escaped for a
regex matcher and joined `(a|b)`, so a value's `.` or `+` must survive the query's own regex), and
Grafana's `$__` interval macros as durations. A variable's query is what Grafana runs for it:
`label_values(selector, label)` the selector, `query_result(expr)` the expression.

promtool (tests/deploy/test_rules.py) parses the rules with Prometheus itself; the live tests
(tests/live/test_prometheus*.py) run all of them against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser
import pytest
import yaml

from grafana import dashboard
from tests.support.base import ROOT

RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"

# Grafana's global macros a query may use, at what a 1-minute step would give.
MACROS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__interval_ms": "60000",
    "__range_ms": "3600000",
    "__range_s": "3600",
}
# Two values for each query variable, as a user would pick them: a host of each hostname label's
# style, and a profile with a regex metacharacter (NVML's `+me`).
PICKED = {
    "Hostname": ["gpu-node-1", "nvidia-dcgm-exporter-q28k4"],
    "gpu": ["0", "1"],
    "GPU_I_PROFILE": ["1g.5gb", "1g.5gb+me"],
}
# `$name`, `${name}`, `${name:format}`, `[[name]]`: Grafana's variable syntaxes.
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def model() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(dashboard.OUTPUT.read_text(encoding="utf-8"))
    return loaded


def regex_escape(value: str) -> str:
    """Grafana's `prometheusSpecialRegexEscape`: a value written into a regex matcher's string."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m[0], value.replace("\\", "\\" * 4))


def variable_value(variable: dict[str, Any], picked: list[str] | None) -> str:
    """What Grafana writes for a variable in a Prometheus query: all (`picked` None), or the
    values picked (Grafana's `interpolateQueryExpr`)."""
    if picked is None:
        assert variable.get("includeAll") and variable.get("allValue"), variable["name"]
        return str(variable["allValue"])
    if not variable.get("multi") and not variable.get("includeAll"):
        (value,) = picked
        return value.replace("\\", "\\\\").replace("'", "\\\\'").replace('"', '\\"')
    escaped = [regex_escape(v) for v in picked]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate(text: str, values: dict[str, str]) -> str:
    """`text` with the dashboard's variables and Grafana's macros replaced; an unknown name
    (label_replace's `$1`) is left as it is, as Grafana leaves it."""

    def replace(found: re.Match[str]) -> str:
        name = found[1] or found[2] or found[3]
        return values.get(name, MACROS.get(name, found[0]))

    plain = VARIABLE.sub(replace, text)
    left = [m[0] for m in VARIABLE.finditer(plain) if not (m[1] or m[2] or m[3]).isdigit()]
    assert not left, f"variables Grafana would not resolve: {left} in {text}"
    return plain


def scenarios() -> dict[str, dict[str, str]]:
    """The dashboard's query variables' values: all at "All", and each at two values."""
    variables = [v for v in model()["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == set(PICKED), "give each variable values in PICKED"
    return {
        "all": {v["name"]: variable_value(v, None) for v in variables},
        "picked": {v["name"]: variable_value(v, PICKED[v["name"]]) for v in variables},
    }


def panel_queries() -> list[tuple[str, str]]:
    """(id, expression) of every panel target, a collapsed row's too, opt-in fields' too."""
    out = []
    panels = model()["panels"]
    for panel in [*panels, *(inner for p in panels for inner in p.get("panels", []))]:
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((f"{panel['title']} {target['refId']}", target["expr"]))
    assert [expr for _, expr in out] == dashboard.queries(model(), opt_in=True)
    return out


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, function, PromQL) of what Grafana runs for each query variable."""
    out = []
    for variable in model()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query.get("query", "") if isinstance(query, dict) else query
        if found := re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", text, re.S):
            out.append((variable["name"], "label_values", found[1]))
        elif found := re.fullmatch(r"\s*query_result\((.*)\)\s*", text, re.S):
            out.append((variable["name"], "query_result", found[1]))
        else:  # label_names(), metrics(regex), label_values(label): no PromQL to parse
            assert re.fullmatch(r"\s*(label_names|metrics|label_values)\([^(),]*\)\s*", text), text
    return out


def rules() -> list[dict[str, Any]]:
    doc: dict[str, Any] = yaml.safe_load(RULE.read_text(encoding="utf-8"))
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def parse(promql: str) -> promql_parser.Expr:
    try:
        return promql_parser.parse(promql)
    except ValueError as error:
        pytest.fail(f"promql-parser: {error}\n{promql}")


def unwrap(expr: promql_parser.Expr) -> promql_parser.Expr:
    while isinstance(expr, promql_parser.ParenExpr):
        expr = expr.expr
    return expr


def assert_instant(expr: promql_parser.Expr, promql: str) -> None:
    """A graph's query (Grafana runs range queries) and a rule's expression give an instant
    vector or a scalar: a range vector or a string is refused by Prometheus there."""
    top = unwrap(expr)
    refused = (
        promql_parser.MatrixSelector,
        promql_parser.SubqueryExpr,
        promql_parser.StringLiteral,
    )
    assert not isinstance(top, refused), f"{type(top).__name__}, not a vector: {promql}"


@pytest.mark.parametrize("scenario", ["all", "picked"])
@pytest.mark.parametrize(("where", "expr"), panel_queries(), ids=[i for i, _ in panel_queries()])
def test_every_panel_query_parses(where: str, expr: str, scenario: str) -> None:
    promql = interpolate(expr, scenarios()[scenario])
    assert_instant(parse(promql), promql)


@pytest.mark.parametrize("scenario", ["all", "picked"])
@pytest.mark.parametrize(
    ("name", "function", "query"), variable_queries(), ids=[n for n, _, _ in variable_queries()]
)
def test_every_variable_query_parses(name: str, function: str, query: str, scenario: str) -> None:
    """`label_values`' first argument is a series selector (Grafana asks the series API
    with it), `query_result`'s an instant query."""
    promql = interpolate(query, scenarios()[scenario])
    expr = parse(promql)
    if function == "label_values":
        assert isinstance(expr, promql_parser.VectorSelector), f"not a selector: {promql}"
    assert_instant(expr, promql)


@pytest.mark.parametrize("rule", rules(), ids=[r.get("record") or r["alert"] for r in rules()])
def test_every_rule_expression_parses(rule: dict[str, Any]) -> None:
    expr = str(rule["expr"])
    assert_instant(parse(expr), expr)
    for key in ("for", "keep_firing_for"):
        if key in rule:
            promql_parser.parse_duration(str(rule[key]))


def test_the_checks_refuse_what_grafana_or_prometheus_would() -> None:
    """A broken query, an unknown function, a regex that does not compile once a value is
    written in unescaped, and a range vector as a panel's query all fail here."""
    for bad in ("sum(DCGM_FI_DEV_FB_USED", "maxx(DCGM_FI_DEV_FB_USED)", 'x{a=~"1g.5gb+me("}'):
        with pytest.raises(ValueError):
            promql_parser.parse(bad)
    for range_vector in ("x[5m]", "(rate(x[5m])[10m:1m])"):
        with pytest.raises(AssertionError, match="not a vector"):
            assert_instant(parse(range_vector), range_vector)
    escaped = interpolate('x{p=~"(MIG )?($GPU_I_PROFILE)"}', {"GPU_I_PROFILE": regex_escape("a(")})
    assert escaped == 'x{p=~"(MIG )?(a\\\\()"}'
    parse(escaped)
    with pytest.raises(AssertionError, match="would not resolve"):
        interpolate('x{gpu=~"$gpuu"}', {"gpu": ".*"})
