"""`gpucluster check STACK`: plan the stack offline and hold what it registers to the policy pack."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from ..spec import SpecError
from .common import EXIT_FAILED, EXIT_OK, policy_settings, report_bad_input
from .plan import add_parser as add_plan_parser
from .plan import Planned, plan_stack

if TYPE_CHECKING:
    from ..offline.policy import Violation

HELP = ("plan a stack offline and check it against the policy pack (exit 1 on a mandatory violation); "
        "prints the findings and writes check.json beside the plan, and with --format markdown check.md (a "
        "pull-request comment, shortened to fit one) and check-full.md")


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_plan_parser(parser)
    parser.add_argument("--policy-config", type=Path,
                        help="policy-pack config (the JSON `pulumi preview --policy-pack-config` reads; default: "
                             "policies/config/STACK.json when it exists)")
    parser.add_argument("--format", choices=("text", "markdown"), default="text",
                        help="text (default), or markdown: also write check.md for a pull-request comment and "
                             "check-full.md (the text report is printed either way)")


def run(args: argparse.Namespace) -> int:
    try:                # a bad policy config stops before anything is planned or written
        policies, config_file, config = policy_settings(args)
    except SpecError as e:
        return report_bad_input(e)
    planned = plan_stack(args)
    if isinstance(planned, int):
        return planned
    from ..offline.policy import evaluate
    violations = evaluate(planned.run, policies, config)
    _add_results_to_report(planned, violations)
    descriptions = {p.name: p.description for p in policies}
    levels = _levels(policies, config)
    ran = sum(level != "disabled" for level in levels.values())
    report = {"stack": planned.stack, "config": str(config_file) if config_file else None, "policies": ran,
              "violations": [v.__dict__ for v in violations], "levels": levels}
    (planned.out / "check.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.format == "markdown":
        full = _markdown(planned.stack, violations, descriptions, ran, config_file, planned.plan.errors,
                         None, None, None)
        (planned.out / "check-full.md").write_text(full, encoding="utf-8")
        text = markdown(planned.stack, violations, descriptions, ran, config_file, planned.plan.errors,
                        "check-full.md (a CI job keeps it as an artifact)")
        (planned.out / "check.md").write_text(text, encoding="utf-8")
    # The text report in both formats: it is what a CI job's log keeps, whatever is posted as a comment.
    print("\n" + plain(planned.stack, violations, descriptions, ran, config_file), end="")
    if args.format == "markdown":
        print(f"\nMarkdown for a pull-request comment: {planned.out / 'check.md'} (the full report: "
              f"{planned.out / 'check-full.md'})")
    mandatory = [v for v in violations if v.level == "mandatory"]
    if planned.plan.errors:
        return EXIT_FAILED
    return EXIT_FAILED if mandatory else EXIT_OK


def _add_results_to_report(planned: Planned, violations: list[Violation]) -> None:
    """report.md gains the policy results, judged with the same thresholds."""
    from ..offline.report import PolicyResults, render_report
    report = planned.out / "report.md"
    if not report.exists() or not planned.plan.clusters:
        return
    spec = planned.plan.clusters[0]
    mandatory = sum(v.level == "mandatory" for v in violations)
    results = PolicyResults(mandatory, len(violations) - mandatory,
                            [(v.policy, v.level, v.resource, v.message) for v in violations])
    report.write_text(render_report(spec, planned.thresholds, results), encoding="utf-8")


def _levels(policies: list[Any], config: dict[str, tuple[int, dict[str, Any]]] | None) -> dict[str, str]:
    from pulumi.runtime.proto import analyzer_pb2 as apb
    return {p.name: (apb.EnforcementLevel.Name(config[p.name][0]).lower() if config else p.enforcement_level.value)
            for p in policies}


def _grouped(violations: list[Violation]) -> dict[str, list[Violation]]:
    out: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        out[v.policy].append(v)
    return dict(sorted(out.items(), key=lambda kv: (kv[1][0].level != "mandatory", kv[0])))


def _headline(stack: str, violations: list[Violation], count: int, config: Path | None) -> str:
    mandatory = sum(v.level == "mandatory" for v in violations)
    advisory = len(violations) - mandatory
    return (f"Policies: {count} checked on stack {stack} ({f'config {config}' if config else 'default levels'}): "
            f"{mandatory} mandatory and {advisory} advisory finding(s)")


def plain(stack: str, violations: list[Violation], descriptions: dict[str, str], count: int,
          config: Path | None) -> str:
    lines = [_headline(stack, violations, count, config)]
    for policy, found in _grouped(violations).items():
        lines += ["", f"{policy} ({found[0].level}): {descriptions.get(policy, '')}"]
        lines += [f"  {v.resource}: {v.message}" for v in found]
    return "\n".join(lines) + "\n"


# A GitHub comment holds at most 65,536 characters (the API refuses a longer body).
MAX_COMMENT_CHARS = 65_536
# How far the comment shortens, step by step, until it fits: findings shown per policy, characters per message.
_SHORTER = ((None, None), (10, 600), (3, 300), (0, 0))


def markdown(stack: str, violations: list[Violation], descriptions: dict[str, str], count: int,
             config: Path | None, plan_errors: list[str], full_report: str | None = None) -> str:
    """The report for a pull-request comment: every finding when it fits a comment, else the first few of each
    policy with a count of the rest and a pointer to `full_report` (the same report unshortened)."""
    for shown, chars in _SHORTER:
        text = _markdown(stack, violations, descriptions, count, config, plan_errors, shown, chars, full_report)
        if len(text) <= MAX_COMMENT_CHARS:
            return text
    return text[:MAX_COMMENT_CHARS - 200] + f"\n\n(cut to fit a comment; the full report is {full_report})\n"


def _markdown(stack: str, violations: list[Violation], descriptions: dict[str, str], count: int,
              config: Path | None, plan_errors: list[str], shown: int | None, chars: int | None,
              full_report: str | None) -> str:
    def first(items: list[str]) -> list[str]:
        kept = items if shown is None else items[:max(shown, 1)]
        cut = [m if chars is None or len(m) <= chars else m[:chars] + "..." for m in kept]
        more = len(items) - len(kept)
        return cut + ([f"- ... and {more} more{f': see {full_report}' if full_report else ''}"] if more else [])

    mandatory = any(v.level == "mandatory" for v in violations) or bool(plan_errors)
    lines = [f"### gpucluster check: `{stack}` {'fails' if mandatory else 'passes'}", "",
             _headline(stack, violations, count, config) + ".", ""]
    if shown is not None and full_report:
        lines += [f"Shortened to fit a pull-request comment: the full report is {full_report}.", ""]
    if plan_errors:
        lines += ["**Plan errors**", "", *first([f"- {_md(e)}" for e in plan_errors]), ""]
    grouped = _grouped(violations)
    if grouped:
        lines += ["| policy | level | findings |", "| --- | --- | ---: |"]
        lines += [f"| `{p}` | {found[0].level} | {len(found)} |" for p, found in grouped.items()]
        for policy, found in grouped.items() if shown != 0 else ():
            lines += ["", f"<details><summary><code>{policy}</code> ({found[0].level}): "
                          f"{_md(descriptions.get(policy, ''))}</summary>", ""]
            lines += first([f"- `{v.resource}`: {_md(v.message)}" for v in found])
            lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")

