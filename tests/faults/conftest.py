"""Fault tests keep their own diagnostics: a failed test's report gets the output of the
swarm's member processes and the seed's view of each (tests/faults/procs.describe)."""

from __future__ import annotations

import logging

import pytest

from tests.cluster.conftest import box_model, box_ok  # noqa: F401  (the box tests' fixtures)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    swarm = item.funcargs.get("swarm")
    describe = getattr(swarm, "describe", None)
    if describe is not None:
        try:
            report.sections.append(("swarm members", describe()))
        except Exception as exc:  # noqa: BLE001 -- diagnostics must not hide the failure
            report.sections.append(("swarm members", f"could not describe: {exc!r}"))


@pytest.fixture(autouse=True)
def _client_logs(caplog):
    """The client's own account (bans, failovers, routes) in a failed test's report."""
    caplog.set_level(logging.INFO, logger="drift")
    yield
