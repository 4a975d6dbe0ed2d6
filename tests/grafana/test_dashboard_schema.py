"""The shipped dashboard under Grafana's own schema: `@grafana/schema` (npm) with `tsc --strict`.

The dashboard is written as TypeScript object literals typed with Grafana's types
(tests/grafana/schema/schema.ts): the whole model as one `Dashboard` literal, and each panel's
plugin `options` and `fieldConfig.defaults.custom` as literals of its plugin's types, which
`Dashboard` leaves open. A fresh object literal gets TypeScript's excess property check at
every depth, so a key Grafana does not know fails as surely as a wrong type; importing the
JSON instead would check no key at all.

The tools are pinned in tests/grafana/schema/package.json and package-lock.json and installed
by ./scripts/install-dashboard-tools (`make test` runs it). Without them the test fails in CI
(`CI` set) and is skipped elsewhere.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from grafana.dashboard import OUTPUT as DASHBOARD
from tests.support.base import ROOT

SCHEMA = ROOT / "tests" / "grafana" / "schema"
TSC = SCHEMA / "node_modules" / "typescript" / "bin" / "tsc"
GRAFANA_SCHEMA = SCHEMA / "node_modules" / "@grafana" / "schema" / "package.json"
# tsc's diagnostics: `file(line,col): error TS2353: message`.
DIAGNOSTIC = re.compile(
    r"^(?P<file>[^(\s]+)\((?P<line>\d+),\d+\): error (?P<code>TS\d+): (?P<text>.*)$"
)
UNKNOWN_KEY = re.compile(r"""'"?(?P<key>[^'"]+)"?' does not exist in type""")


def tsc() -> list[str]:
    """The pinned TypeScript compiler (what `npx tsc` runs there, without npx's fallback to the
    registry)."""
    node = shutil.which("node")
    if node and TSC.is_file() and GRAFANA_SCHEMA.is_file():
        return [node, str(TSC)]
    message = (
        "node and tests/grafana/schema/node_modules are required: run "
        "./scripts/install-dashboard-tools"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def literal(value: Any) -> str:
    """A JSON value as a TypeScript expression: JSON is one (ASCII, so no line separator ends a
    string)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)


def typescript(model: dict[str, Any]) -> str:
    """The dashboard as the object literals the check types: the whole model as `Dashboard`,
    then each panel's plugin options and custom field config (rows have none). A panel type
    missing from schema.ts's `Plugins` fails to compile: add its plugin's types there."""
    lines = [
        f"import type {{ Dashboard, Plugins }} from {json.dumps(str(SCHEMA / 'schema'))};",
        "",
        f"export const dashboard: Dashboard = {literal(model)};",
    ]
    panels = model.get("panels", [])
    for panel in [*panels, *(inner for p in panels for inner in p.get("panels", []))]:
        kind, number = panel["type"], panel["id"]
        if kind == "row":
            continue
        if "options" in panel:
            lines.append(
                f"export const options{number}: Plugins[{json.dumps(kind)}]['options'] = "
                f"{literal(panel['options'])};"
            )
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None:
            lines.append(
                f"export const custom{number}: Plugins[{json.dumps(kind)}]['custom'] = "
                f"{literal(custom)};"
            )
    return "\n".join(lines) + "\n"


def check(work: Path, sources: dict[str, str]) -> dict[str, list[str]]:
    """`tsc --noEmit` over `sources` (file name -> text) with tests/grafana/schema's settings:
    each file's errors, as `line: TScode: message` with the offending line of source."""
    for name, text in sources.items():
        (work / name).write_text(text, encoding="utf-8")
    config = {"extends": str(SCHEMA / "tsconfig.json"), "files": sorted(sources)}
    (work / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    result = subprocess.run(
        [*tsc(), "--noEmit", "-p", str(work / "tsconfig.json")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors: dict[str, list[str]] = {name: [] for name in sources}
    output = (result.stdout + result.stderr).splitlines()
    for line in output:
        found = DIAGNOSTIC.match(line)
        if not found:
            continue
        name = Path(found["file"]).name
        assert name in errors, f"tsc found an error outside the checked files: {line}"
        source = sources[name].splitlines()[int(found["line"]) - 1].strip()
        errors[name].append(f"{found['line']}: {found['code']}: {found['text']}\n    {source}")
    # Any other failure (a broken install, a bad config) is not the dashboard's: say so.
    assert result.returncode == 0 or any(errors.values()), "\n".join(output)
    return errors


def unknown_keys(errors: list[str]) -> set[str]:
    return {m["key"] for e in errors if "TS2353" in e and (m := UNKNOWN_KEY.search(e))}


def test_the_dashboard_has_only_keys_grafana_knows(tmp_path: Path) -> None:
    """Every key of the dashboard is one Grafana's schema has, with a value of its type; and
    the check is shown to catch what it should: the same dashboard with keys planted at each
    level (a variable, a panel, a plugin's options and custom config) and a value outside an
    enum is refused for each of them, in the same run."""
    model: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    planted = copy.deepcopy(model)
    planted["templating"]["list"][1]["auto"] = False  # what the SDK once wrote: interval-only
    timeseries = next(p for p in planted["panels"] if p["type"] == "timeseries")
    timeseries["transparentt"] = True
    timeseries["options"]["legend"]["showLegendd"] = True
    timeseries["fieldConfig"]["defaults"].setdefault("custom", {})["lineWidthh"] = 1
    timeseries["options"]["tooltip"]["mode"] = "several"  # not a TooltipDisplayMode
    table = next(p for p in planted["panels"] if p["type"] == "table")
    table["fieldConfig"]["defaults"]["custom"]["alignn"] = "auto"

    errors = check(tmp_path, {"dashboard.ts": typescript(model), "planted.ts": typescript(planted)})

    assert not errors["dashboard.ts"], (
        f"{DASHBOARD.relative_to(ROOT)} does not pass Grafana's schema (@grafana/schema, "
        "tsc --strict); fix grafana/dashboard.py and regenerate it (tsc names only the first "
        "unknown key of each object):\n" + "\n".join(errors["dashboard.ts"])
    )
    assert unknown_keys(errors["planted.ts"]) == {
        "auto", "transparentt", "showLegendd", "lineWidthh", "alignn",
    }, errors["planted.ts"]  # fmt: skip
    assert any('"several"' in e and "TS2322" in e for e in errors["planted.ts"]), errors
    assert len(errors["planted.ts"]) == 6, errors["planted.ts"]
