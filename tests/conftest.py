"""Session set-up shared by every test directory."""

from __future__ import annotations


def pytest_sessionstart(session) -> None:
    """Compile the cost model's formulas once (engine_advisor.model.formulas; numba writes them to
    its cache beside the modules), so that the services and simulators the tests start load them
    instead of each compiling them while a readiness timeout runs."""
    from engine_advisor.model.fit.default import default_model
    from engine_advisor.model.recommend import warm_up

    warm_up(default_model())
