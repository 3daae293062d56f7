"""gecod's journal budget for refusals: a few records per peer, then one summary."""

from __future__ import annotations

from geco.daemon.ratelimit import RefusalBudget, Summary


def test_a_peer_gets_its_burst_then_its_refusals_are_summed_up_by_reason() -> None:
    budget = RefusalBudget(burst=3, window=10)
    allowed = [budget.allow(65534, "timeout") for _ in range(5)]
    allowed += [budget.allow(65534, "magic") for _ in range(4)]
    assert allowed == [True] * 3 + [False] * 6
    [summary] = budget.end_window()
    assert summary == Summary(65534, {"timeout": 2, "magic": 4})
    assert summary.describe(10) == "uid 65534: 6 more refusals in 10 s (magic 4, timeout 2)"


def test_peers_have_budgets_of_their_own_and_a_new_window_starts_afresh() -> None:
    budget = RefusalBudget(burst=1, window=10)
    assert [budget.allow(1000, "closed"), budget.allow(1000, "closed")] == [True, False]
    assert budget.allow(None, "closed")  # TCP clients: one peer of their own
    assert [s.peer for s in budget.end_window()] == [1000]
    assert budget.allow(1000, "closed")
    assert budget.end_window() == []


def test_root_is_never_held_back() -> None:
    budget = RefusalBudget(burst=1, window=10)
    assert all(budget.allow(0, "closed") for _ in range(100))
    assert budget.end_window() == []


def test_thousands_are_written_with_separators() -> None:
    assert Summary(None, {"closed": 9000, "timeout": 977}).describe(10) == (
        "TCP clients: 9,977 more refusals in 10 s (closed 9,000, timeout 977)")
