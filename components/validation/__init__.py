"""The checks that prove a built cluster performs as designed, run by `gpucluster validate STACK --kubeconfig`."""

from .suite import Check, Result, judge, plan_suite, render_suite_files

__all__ = ["Check", "Result", "judge", "plan_suite", "render_suite_files"]
