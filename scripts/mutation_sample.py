"""A mutation score from a random sample of the product's mutants (`make mutation-sample`).

The product makes about 12,000 mutants: judging them all takes a day on 2 cores. A random
sample of a few hundred per package estimates each package's score within a few points, in
about an hour (mutant sampling: the score of a random sample is an unbiased estimate of the
whole one). The sample is stratified by package, drawn with a fixed seed so that a run can be
repeated, and judged by mutmut with the configuration of `pyproject.toml`.

    python scripts/mutation_sample.py --per-package 250 --seed 9
    python scripts/mutation_sample.py --report-only   # the last run's figures again
    python scripts/mutation_sample.py --rejudge-only  # survivors judged again (after new tests)

mutmut forks each mutant's test run from a process that has imported the product already, and
picks the tests by the calls it saw once. So it cannot kill a mutant of code that runs at import
(the catalog's tables are built then), nor see every test that reaches a cached function (only
the first caller fills the cache). Each survivor is therefore judged again in a fresh process that
imports the product with the mutant on, by the whole unit suite (stopping at the first failure;
the test modules named after the mutant's module first, then those naming its function or class):
`rejudged` in the report. Such a kill counts only if the test that failed passes with no mutant
on: with tests newer than the product code the mutants were made from (`--rejudge-only` after a
fix), a test can fail for the fix, not for the mutant.

Prints, per package and for the product (packages weighted by their mutant counts), the score
with its 95 % Wilson interval, then the survivors. Exit 0 whatever the score: the figures are
recorded by hand in tests/README.md, with the survivors accepted and why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mutmut.stats import status_by_exit_code

# The packages issue 9 holds to 90 %, and mig_exporter/common/ and web/, which hold code that came
# out of them (the bounded readers, the HTTP server); mig_exporter/kube/ (the API client plumbing)
# is judged by `make mutation`.
PACKAGES = ("topology", "status_updater", "exporter", "mig_exporter.common", "mig_exporter.web")
DETECTED = ("killed", "timeout", "segfault", "rejudged")
MUTMUT = [sys.executable, "-m", "mutmut"]
# Quick tests of the whole pipeline, run right after the mutant's own module's when a survivor is
# judged again: most mutants they catch, they catch in seconds.
BROAD = (
    "tests/pipeline/test_golden.py",
    "tests/status_updater/test_reconcile.py",
    "tests/status_updater/test_static.py",
    "tests/exporter/test_exporter.py",
    "tests/status_updater/test_sharing.py",
)


def statuses(root: Path) -> dict[str, str]:
    """Every mutant mutmut has made under root/mutants, with its status (`not checked` if not run)."""
    found: dict[str, str] = {}
    for meta in sorted((root / "mutants").rglob("*.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            found[name] = status_by_exit_code[code]
    return found


@dataclass(frozen=True)
class Suite:
    """The unit suite as mutmut's configuration selects it, read once: its files in name order,
    the text of each (to find the ones naming a function), pytest's other options, and which
    test files mutmut saw reaching each function (its stats, from the clean run)."""

    files: dict[str, str]  # tests/<room>/test_x.py -> its text
    options: list[str]
    reaching: dict[str, list[str]]  # mangled function name -> test files, quickest first

    @classmethod
    def read(cls, root: Path) -> Suite:
        selection = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
        args: list[str] = selection["pytest_add_cli_args_test_selection"]
        ignored = tuple(a.removeprefix("--ignore=") for a in args if a.startswith("--ignore="))
        mutants = root / "mutants"
        found = sorted((mutants / "tests").rglob("test_*.py"), key=lambda p: p.name)
        files = {
            name: p.read_text()
            for p in found
            if not (name := p.relative_to(mutants).as_posix()).startswith(ignored)
        }
        options = [a for a in args if a != "tests/" and not a.startswith("--ignore=")]
        return cls(files, options, _reaching(mutants / "mutmut-stats.json", files))

    def ordered_for(self, name: str) -> list[str]:
        """The files named after the mutant's module (where its newest tests are: mutmut's stats
        know only the tests of its own run), then those whose tests mutmut saw reach its
        function, then those that name its function (or its class), then the broad ones, then
        the rest. One by one: given a directory too, pytest runs its files in name order,
        whatever came first on the command line."""
        parts = name.split(".")
        # topology.catalog.x__p__mutmut_30, status_updater.placement.shared.xǁBoardǁhold__mutmut_2
        at = next(i for i, part in enumerate(parts) if part.startswith(("x_", "xǁ")))
        module = parts[at - 1].strip("_")
        function = parts[at].split("__mutmut_")[0].removeprefix("x_").removeprefix("xǁ")
        word = function.split("ǁ")[0].strip("_")  # xǁLeaderElectorǁrelease -> LeaderElector
        reaching = self.reaching.get(name.split("__mutmut_")[0], [])
        named = [f for f in self.files if module and module in f.rsplit("/test_", 1)[1]]
        naming = [f for f, text in self.files.items() if word and word in text]
        broad = [t for t in BROAD if t in self.files]
        return list(dict.fromkeys([*named, *reaching, *naming, *broad, *self.files]))


def _reaching(stats: Path, files: dict[str, str]) -> dict[str, list[str]]:
    """Per function, the files of the tests that called it in mutmut's clean run, the file of
    the quickest such test first."""
    if not stats.exists():
        return {}
    data = json.loads(stats.read_text())
    duration: dict[str, float] = data.get("duration_by_test", {})
    out: dict[str, list[str]] = {}
    for function, tests in data.get("tests_by_mangled_function_name", {}).items():
        quickest: dict[str, float] = {}
        for test in tests:
            file = test.split("::", 1)[0]
            if file in files:
                quickest[file] = min(quickest.get(file, math.inf), duration.get(test, math.inf))
        out[function] = sorted(quickest, key=lambda f: quickest[f])
    return out


# pytest's short summary: `FAILED tests/x.py::test_y[a b] - AssertionError: ...` (ids may hold
# blanks); not the `ERROR    logger:file.py:1 ...` lines of captured logs.
_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (tests/\S.*?)(?: - .*)?$")


def rejudge(root: Path, suite: Suite, name: str, seconds: float) -> tuple[str, str | None]:
    """`killed` and the test that failed, if the unit suite fails with the mutant on from the first
    import; else `survived` (also when it has not failed within `seconds`: a lower bound)."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:randomly"]
    # A session of its own: on timeout the daemons its tests started go with it, not only pytest.
    # Output to a file, not a pipe, which such a daemon could hold open after pytest ends.
    with (
        tempfile.TemporaryFile("w+") as out,
        subprocess.Popen(
            [*command, *suite.ordered_for(name), *suite.options],
            cwd=root / "mutants",
            env={**os.environ, "MUTANT_UNDER_TEST": name},
            stdout=out,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        ) as run,
    ):
        try:
            run.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return "survived", None  # not killed in time: a survivor
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
        out.seek(0)
        summary = out.read()
    if run.returncode == 0:
        return "survived", None
    failed = [m[1] for line in summary.splitlines() if (m := _SUMMARY.match(line))]
    return "killed", failed[0] if failed else "?"


def fails_clean(root: Path, test: str) -> bool:
    """Whether a test fails with no mutant on: then what it "killed" proves nothing (a test newer
    than the product code the mutants were made from, or a flaky one). A run that failed before
    any test could (`?`: the product failed to import with the mutant on) counts: the clean run
    mutmut starts with has shown that the suite imports without one."""
    if test == "?":
        return False
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", test],
        cwd=root / "mutants",
        env={**os.environ, "MUTANT_UNDER_TEST": ""},  # matches no mutant: the original code
        capture_output=True,
        check=False,
    )
    return run.returncode != 0


def package(name: str) -> str:
    """A mutant's package: its first dotted part, or two under mig_exporter (common, web, kube)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "mig_exporter" else parts[0]


def draw(names: list[str], per_package: int, seed: int) -> list[str]:
    """per_package mutants of each package, at random; all of a package that has fewer."""
    rng = random.Random(seed)
    chosen: list[str] = []
    for pkg in PACKAGES:
        mine = sorted(n for n in names if package(n) == pkg)
        chosen += rng.sample(mine, min(per_package, len(mine)))
    return chosen


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion: honest at small n and near 100 %."""
    if n == 0:
        return 0.0, 1.0
    z = 1.96
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def report(found: dict[str, str], sample: list[str]) -> str:
    totals = Counter(package(n) for n in found)
    lines = [
        f"{'package':<16}{'mutants':>8}{'sampled':>8}{'judged':>7}{'killed':>7}  score (95 % interval)"
    ]
    weighted, weight = 0.0, 0
    for pkg in PACKAGES:
        judged = [found[n] for n in sample if package(n) == pkg and found[n] != "not checked"]
        if not judged:
            continue
        hits = sum(s in DETECTED for s in judged)
        low, high = wilson(hits, len(judged))
        lines.append(
            f"{pkg:<16}{totals[pkg]:>8}{sum(package(n) == pkg for n in sample):>8}{len(judged):>7}{hits:>7}"
            f"  {hits / len(judged):.1%} ({low:.1%} to {high:.1%})"
        )
        weighted += totals[pkg] * hits / len(judged)
        weight += totals[pkg]
    if weight:
        lines.append(
            f"{'product':<16}{weight:>8}{'':>8}{'':>7}{'':>7}  {weighted / weight:.1%} (weighted by mutants)"
        )
    survivors = sorted(n for n in sample if found[n] not in DETECTED and found[n] != "not checked")
    lines.append(f"\n{len(survivors)} not killed:")
    lines += [f"  {found[n]:<10} {n}" for n in survivors]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--per-package", type=int, default=250, help="mutants drawn per package (default 250)"
    )
    parser.add_argument("--seed", type=int, default=9, help="the draw's seed (default 9)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--report-only", action="store_true", help="print the last run's figures, run nothing"
    )
    parser.add_argument(
        "--rejudge-only",
        action="store_true",
        help="judge the last run's survivors again, then report",
    )
    parser.add_argument(
        "--rejudge-seconds",
        type=float,
        default=900,
        help="give up on a survivor's fresh run after this long: it stays a survivor (default 900)",
    )
    args = parser.parse_args()
    root = Path.cwd()
    sample_file = root / "mutants" / "sample.txt"
    if not (args.report_only or args.rejudge_only):
        if not (root / "mutants").is_dir():
            # mutmut makes every mutant before it runs any: a pattern matching none only makes them.
            subprocess.run([*MUTMUT, "run", "no-such-mutant"], check=False, capture_output=True)
        sample = draw(list(statuses(root)), args.per_package, args.seed)
        sample_file.write_text("\n".join(sample) + "\n")
        subprocess.run(
            [*MUTMUT, "run", "--max-children", str(args.max_children), *sample], check=False
        )
    sample = sample_file.read_text().split()
    found = statuses(root)
    rejudged_file = root / "mutants" / "rejudged.json"
    rejudged: dict[str, str] = (
        json.loads(rejudged_file.read_text()) if rejudged_file.exists() else {}
    )
    if not args.report_only:
        # The tests as they are now (mutmut copied them when it made the mutants).
        shutil.copytree(root / "tests", root / "mutants" / "tests", dirs_exist_ok=True)
        left = [
            n
            for n in sample
            if found[n] in ("survived", "no tests") and rejudged.get(n) != "killed"
        ]
        suite = Suite.read(root)
        by: dict[str, str] = {}  # mutant -> the test that failed with it on
        with ThreadPoolExecutor(args.max_children) as pool:
            verdicts = pool.map(lambda n: rejudge(root, suite, n, args.rejudge_seconds), left)
            for name, (verdict, test) in zip(left, verdicts, strict=True):
                rejudged[name] = verdict
                rejudged_file.write_text(json.dumps(rejudged, indent=1))
                if test is not None:
                    by[name] = test
        # A kill counts only if the test that made it passes without the mutant.
        bad = {t for t in set(by.values()) if fails_clean(root, t)}
        for name, test in by.items():
            if test in bad:
                rejudged[name] = "survived"
                print(f"not counted: {name} failed {test}, which fails without any mutant too")
        rejudged_file.write_text(json.dumps(rejudged, indent=1))
    for name, verdict in rejudged.items():
        if verdict == "killed":
            found[name] = "rejudged"
    print(report(found, sample))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
