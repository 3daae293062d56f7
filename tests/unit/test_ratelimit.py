"""gecod's journal budgets: a few records per peer or job, then one summary."""

from __future__ import annotations

from geco.daemon.ratelimit import Held, JournalBudget, describe_refusals
from geco.jobkey import JobKey


def test_a_peer_gets_its_burst_then_its_refusals_are_summed_up_by_reason() -> None:
    budget = JournalBudget[int | None](burst=3, window=10, exempt=(0,))
    allowed = [budget.allow(65534, "timeout") for _ in range(5)]
    allowed += [budget.allow(65534, "magic") for _ in range(4)]
    assert allowed == [True] * 3 + [False] * 6
    [summary] = budget.end_window()
    assert summary == Held(65534, {"timeout": 2, "magic": 4})
    assert describe_refusals(summary, 10) == (
        "uid 65534: 6 more refusals in 10 s (magic 4, timeout 2)")


def test_peers_have_budgets_of_their_own_and_a_new_window_starts_afresh() -> None:
    budget = JournalBudget[int | None](burst=1, window=10, exempt=(0,))
    assert [budget.allow(1000, "closed"), budget.allow(1000, "closed")] == [True, False]
    assert budget.allow(None, "closed")  # TCP clients: one peer of their own
    assert [s.key for s in budget.end_window()] == [1000]
    assert budget.allow(1000, "closed")
    assert budget.end_window() == []


def test_root_is_never_held_back() -> None:
    budget = JournalBudget[int | None](burst=1, window=10, exempt=(0,))
    assert all(budget.allow(0, "closed") for _ in range(100))
    assert budget.end_window() == []


def test_thousands_are_written_with_separators() -> None:
    assert describe_refusals(Held(None, {"closed": 9000, "timeout": 977}), 10) == (
        "TCP clients: 9,977 more refusals in 10 s (closed 9,000, timeout 977)")


def test_a_jobs_successes_held_here_and_elsewhere_make_one_summary_per_job() -> None:
    budget = JournalBudget[JobKey](burst=2, window=10)
    a, b = JobKey(42, 1), JobKey(42, 2)
    assert [budget.allow(a, "python") for _ in range(3)] == [True, True, False]
    assert budget.allow(b, "python")
    budget.hold(a, "lane", 500)
    budget.hold(b, "lane", 0)  # nothing held: no summary
    assert budget.end_window() == [Held(a, {"python": 1, "lane": 500})]
    assert budget.end_window() == []
