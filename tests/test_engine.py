"""Engine mechanics: lane semantics as a timeline, deadlock detection."""

import pytest

from parosim.fabric.engine import CountingEnvironment, DeadlockError, check_finished, run_lanes
from parosim.fabric.network import PS


def test_lanes_run_in_order_and_respect_deps():
    env = CountingEnvironment()
    # item: (lane, duration_s, deps)
    items = [("a", 1.0, ()), ("a", 2.0, ()), ("b", 0.5, (0,)), ("b", 1.0, (1,))]
    records = []

    def body(i):
        yield env.timeout(int(items[i][1] * PS))

    run_lanes(env, items, lambda i: items[i][0], lambda i: items[i][2], lambda i: f"op{i}",
              body, records.append)
    env.run()
    got = [(r.name, r.lane, r.start_s, r.end_s) for r in records]
    assert got == [("op0", "a", 0.0, 1.0), ("op2", "b", 1.0, 1.5), ("op1", "a", 1.0, 3.0),
                   ("op3", "b", 3.0, 4.0)]


def test_deadlock_is_detected_and_named():
    env = CountingEnvironment()
    items = [("a", (1,)), ("b", (0,))]  # a waits for b, b waits for a

    def body(i):
        yield env.timeout(1)

    done = run_lanes(env, items, lambda i: items[i][0], lambda i: items[i][1],
                     lambda i: f"op{i}", body)
    env.run()  # returns: no event pending
    with pytest.raises(DeadlockError, match="'op0' on lane 'a', which waits for op1"):
        check_finished(done, lambda i: f"op{i}", lambda i: items[i][1],
                       lambda i: items[i][0], env)


def test_event_count_is_the_number_of_schedule_calls():
    """``CountingEnvironment.events`` reads simpy's event numbering; it must equal a count
    of every ``schedule`` call, reading it must not change the numbering, and a whole
    collective's count is unchanged."""

    class Tally(CountingEnvironment):
        calls = 0

        def schedule(self, event, priority=1, delay=0):
            Tally.calls += 1
            super().schedule(event, priority, delay)

    env = Tally()
    items = [("a", 1.0, ()), ("a", 2.0, ()), ("b", 0.5, (0,)), ("b", 1.0, (1,))]

    def body(i):
        yield env.timeout(int(items[i][1] * PS))
        assert env.events == Tally.calls   # read mid-run

    run_lanes(env, items, lambda i: items[i][0], lambda i: items[i][2], lambda i: f"op{i}",
              body)
    env.run()
    assert Tally.calls > 10
    assert env.events == env.events == Tally.calls


def test_critical_link_credit_is_the_same_in_batches(monkeypatch, capsys):
    """The critical-link seconds (hot_links' critical_s) are added a batch of paces at a
    time: one pace per batch gives the same figures, bit for bit, as one batch."""
    import json

    import parosim.fabric.network as network
    from parosim.cli.commands import main

    argv = ["simulate", "--model", "llama-7b", "--nodes", "4", "--strategy", "IIG", "--json"]
    assert main(argv) == 0
    whole = json.loads(capsys.readouterr().out)["hot_links"]
    monkeypatch.setattr(network, "_CREDIT_BATCH", 0)
    assert main(argv) == 0
    batched = json.loads(capsys.readouterr().out)["hot_links"]
    assert whole == batched
    assert any(h["critical_s"] > 0 for h in whole)
