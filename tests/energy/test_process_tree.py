"""ProcessTreeCpu on real processes: exited children counted once, orphans followed."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

import psutil
import pytest

from tunefleet.energy.meters import ProcessTreeCpu

# serial: the figures are CPU seconds of forks and exits, which a loaded machine inflates (two of
# these failed once beside another suite's run)
pytestmark = pytest.mark.serial


def _in_a_fresh_process(body: Callable[[], None]) -> None:
    """Run ``body`` in a process forked for it, and fail with its traceback if it fails.

    The tests below measure the tree of the process they run in. Under the full suite pytest's
    own tree also holds the servers and pools other tests started (an S3 server, Prometheus,
    builder workers), whose CPU time would leak into the figures; a forked process starts with
    no children and zeroed ``children_*`` times, so its tree is what ``body`` starts.
    """
    ctx = multiprocessing.get_context("fork")
    results, result_end = ctx.Pipe(duplex=False)

    def main() -> None:
        try:
            body()
            result_end.send(None)
        except BaseException:
            result_end.send(traceback.format_exc())

    process = ctx.Process(target=main)
    process.start()
    try:
        error = results.recv() if results.poll(300) else "the test body did not finish in 300 s"
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    if error is not None:
        pytest.fail(error, pytrace=False)


def _burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def _burn_twice(conn: Connection, seconds: float) -> None:
    _burn_cpu(seconds)
    conn.send(time.process_time())
    conn.recv()
    _burn_cpu(seconds)
    conn.send(time.process_time())


def test_child_seen_alive_then_reaped_is_counted_once() -> None:
    _in_a_fresh_process(_child_seen_alive_then_reaped)


def _child_seen_alive_then_reaped() -> None:
    tree = ProcessTreeCpu()
    base, own0 = tree.sample(), _own_cpu()
    parent_end, child_end = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=_burn_twice, args=(child_end, 0.3), daemon=True)
    child.start()
    halfway = parent_end.recv()
    alive = tree.sample() - base  # the child is seen with its own CPU time
    assert alive >= halfway - 0.05
    assert tree.tracked >= 2
    parent_end.send("go")
    burned = parent_end.recv()
    child.join(timeout=120)
    assert child.exitcode == 0
    total = tree.sample() - base  # now its time is in our children_* figures: not counted again
    own = _own_cpu() - own0
    assert total == pytest.approx(burned + own, abs=0.1)
    assert total >= alive


def test_orphaned_grandchild_is_followed_after_reparenting() -> None:
    _in_a_fresh_process(_orphaned_grandchild_followed)


def _orphaned_grandchild_followed() -> None:
    tree = ProcessTreeCpu()
    base, own0 = tree.sample(), _own_cpu()
    ready_r, ready_w = os.pipe()
    child_go_r, child_go_w = os.pipe()
    grand_go_r, grand_go_w = os.pipe()
    done_r, done_w = os.pipe()
    child_pid = os.fork()
    if child_pid == 0:  # the child: starts a grandchild, then exits, orphaning it
        try:
            grand_pid = os.fork()
            if grand_pid == 0:
                try:
                    os.read(grand_go_r, 1)
                    _burn_cpu(0.4)
                    os.write(done_w, repr(time.process_time()).encode())
                    os.read(grand_go_r, 1)
                finally:
                    os._exit(0)
            os.write(ready_w, str(grand_pid).encode())
            os.read(child_go_r, 1)
        finally:
            os._exit(0)
    try:
        grand_pid = int(os.read(ready_r, 64))
        tree.sample()
        assert tree.tracked >= 3  # this process, the child, the grandchild
        os.write(child_go_w, b"x")
        os.waitpid(child_pid, 0)
        assert psutil.Process(grand_pid).ppid() != child_pid  # re-parented, out of our tree
        assert grand_pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        tree.sample()
        os.write(grand_go_w, b"x")
        burned = float(os.read(done_r, 64))
        tree.sample()  # the orphan is still followed: its 0.4 s are seen
        os.write(grand_go_w, b"x")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # it exits; whoever adopted it reaps it (or not)
            try:
                if psutil.Process(grand_pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        tree.sample()
        _burn_cpu(0.3)  # later growth adds to the orphan's kept time (not hidden by the running max)
        total = tree.sample() - base
        own = _own_cpu() - own0
        assert own >= 0.3
        assert total - own >= burned - 0.1  # kept although nobody we track waited for it
        assert total - own <= burned + 0.15
    finally:
        for fd in (ready_r, ready_w, child_go_r, child_go_w, grand_go_r, grand_go_w, done_r, done_w):
            os.close(fd)


def _burn_on_request(conn: Connection) -> None:
    while conn.recv() == "burn":
        _burn_cpu(0.25)
        conn.send(time.process_time())


def test_vanished_root_keeps_its_last_seen_time() -> None:
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(2)]
    workers = [ctx.Process(target=_burn_on_request, args=(child_end,), daemon=True) for _, child_end in pipes]
    for worker in workers:
        worker.start()
    (first, _), (second, _) = pipes
    try:
        roots = [psutil.Process(worker.pid) for worker in workers]
        tree = ProcessTreeCpu(lambda: roots)  # injected roots: two processes that are not ours to reap
        base = tree.sample()

        first.send("burn")
        first_cpu = first.recv()
        assert tree.sample() - base >= first_cpu - 0.05
        first.send("exit")
        workers[0].join(timeout=120)  # we reap it, but we are not tracked: its time is nowhere else
        tree.sample()
        assert tree.tracked == 1

        second.send("burn")
        second_cpu = second.recv()
        total = tree.sample() - base  # the vanished root's last-seen time is kept under the growth
        assert total == pytest.approx(first_cpu + second_cpu, abs=0.1)
    finally:
        for worker in workers:
            worker.kill()
            worker.join(timeout=30)
