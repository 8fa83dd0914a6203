"""The web worker (routing_project/web_worker.py): gunicorn's threaded worker, taking new
connections in turn with its siblings so that keep-alive clients spread evenly."""

from __future__ import annotations

import http.client
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from routing_project import web_worker

from .webserver import gunicorn


@pytest.fixture
def table():
    """The shared table, emptied before and after (this process plays every worker)."""

    def empty() -> None:
        for row in range(web_worker.MAX_WORKERS):
            web_worker._pids[row] = web_worker._FREE
            web_worker._conns[row] = web_worker._NOT_LISTENING
        web_worker._rows_used.value = 0

    empty()
    yield web_worker
    empty()


def test_a_worker_defers_to_the_sibling_holding_fewest_connections(table):
    a, b, c = table.claim_row(101), table.claim_row(102), table.claim_row(103)
    assert (a, b, c) == (0, 1, 2)
    assert table.fewest_elsewhere(a) is None  # the others still load the application
    table._conns[a], table._conns[b], table._conns[c] = 7, 5, 9
    assert table.fewest_elsewhere(a) == 5
    assert table.fewest_elsewhere(b) == 7
    table._conns[b] = table._NOT_LISTENING  # a stopping worker takes no connection: nobody waits on it
    assert table.fewest_elsewhere(a) == 9
    table.release_row(103)
    assert table.fewest_elsewhere(a) is None  # alone: it takes every connection


def test_a_dead_workers_row_is_reused(table):
    assert table.claim_row(201) == 0
    assert table.claim_row(202) == 1
    table.release_row(201)
    assert table.claim_row(203) == 0
    assert table.claim_row(203) == 0  # claiming twice keeps one row


def test_when_the_table_is_full_a_worker_still_takes_connections(table):
    for pid in range(1000, 1000 + table.MAX_WORKERS):
        assert table.claim_row(pid) is not None
    assert table.claim_row(99) is None


def test_a_lock_left_held_never_blocks_the_master(table):
    """A worker killed while claiming a row leaves the lock held: the next worker goes
    without a row, and the master still frees rows."""
    assert table.claim_row(301) == 0
    assert table._claim_lock.acquire(timeout=1)
    try:
        assert table.claim_row(302) is None
        table.release_row(301)
        assert table._pids[0] == table._FREE
    finally:
        table._claim_lock.release()


# --- gunicorn itself -------------------------------------------------------------------------


def _server_sockets(pid: int, port: int) -> int:
    """Established connections on `port` whose socket process `pid` holds (from /proc)."""
    inodes = set()
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table_path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # ESTABLISHED
                inodes.add(fields[9])
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            held += 1
    return held


def _listening(pid: int, port: int) -> bool:
    """Whether worker `pid` has the listening socket on `port` in its event loop's poller:
    it registers it only in its loop (once the application is loaded), and only while it is
    its turn to take connections (fdinfo of the worker's epoll instance, from /proc)."""
    inodes = set()
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table_path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    listener_fds, epoll_fds = set(), []
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                listener_fds.add(fd.name)
            elif target == "anon_inode:[eventpoll]":
                epoll_fds.append(fd.name)
        for fd_name in epoll_fds:
            for line in Path(f"/proc/{pid}/fdinfo/{fd_name}").read_text().splitlines():
                if line.startswith("tfd:") and line.split()[1] in listener_fds:
                    return True
    except OSError:  # the worker is gone, or closed the fd meanwhile
        return False
    return False


def _workers(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return sorted(int(pid) for pid in children)


def _get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    return response.status


@pytest.mark.xdist_group("web-server")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_keep_alive_clients_are_spread_evenly_and_none_waits_for_a_dead_worker(tmp_path):
    conns: list[http.client.HTTPConnection] = []
    with gunicorn(tmp_path, WEB_WORKERS="2", WEB_THREADS="2") as server:
        port = server.port
        try:
            # Both workers in their loops, each holding as few connections as the other (the
            # start-up probe's connection closed): both listen. A worker still loading the
            # application takes no connection, and its sibling then takes them all.
            deadline = time.monotonic() + 60
            while True:
                workers = _workers(server.process.pid)
                if len(workers) == 2 and all(_listening(pid, port) for pid in workers):
                    break
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.05)

            # Clients connecting one after another, each keeping its connection open: a worker
            # listens only while it holds no more than its sibling, so they end up 6 and 5.
            for _ in range(11):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                assert _get(conn) == 200
                conns.append(conn)
                time.sleep(0.02)
            workers = _workers(server.process.pid)
            held = {pid: _server_sockets(pid, port) for pid in workers}
            assert sorted(held.values()) == [5, 6], held

            # The worker holding 5 killed outright: the master frees its row, so the survivor,
            # holding more than the dead worker's last count, takes the next clients at once
            # instead of waiting for the replacement worker to boot.
            victim = min(workers, key=held.__getitem__)
            survivor = max(workers, key=held.__getitem__)
            os.kill(victim, signal.SIGKILL)
            for _ in range(3):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                assert _get(conn) == 200
                conns.append(conn)
            assert _server_sockets(survivor, port) == 6 + 3, server.log_tail()
        finally:
            for conn in conns:
                conn.close()


def test_a_worker_sets_the_loaded_application_apart_from_the_garbage_collector(tmp_path):
    """A full collection scanned every object of the loaded application (views, serializers,
    URL patterns) and paused the worker for 100-250 ms on a small machine under load."""
    import subprocess

    script = (
        "import gc, runpy, django; django.setup(); "
        "conf = runpy.run_path('gunicorn.conf.py'); conf['post_worker_init'](None); "
        "print(gc.get_freeze_count(), len(gc.get_objects()))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": "test-only-secret-key-for-the-web-worker-tests",
        "ALLOWED_HOSTS": "127.0.0.1",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),  # else gunicorn.conf.py makes one
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    frozen, scanned = map(int, done.stdout.split()[-2:])
    assert frozen > 50_000 and scanned < frozen / 10, done.stdout


def test_a_worker_compiles_patterns_and_imports_before_taking_connections(tmp_path):
    """Django compiles URL patterns and validators' regular expressions on first use, without
    a lock: each thread of a fresh worker that got one of the first requests compiled the same
    ones at once (the email domain pattern takes 30-60 ms alone), and the first lead imported
    the pool, the Redis client and Celery's publishing side: the first leads after a start or
    a recycle waited hundreds of milliseconds."""
    import subprocess

    script = (
        "import runpy, django; django.setup(); "
        "from django.core.validators import EmailValidator; "
        "from django.urls import URLResolver, get_resolver; "
        "from django.utils.functional import empty; "
        "conf = runpy.run_path('gunicorn.conf.py'); "
        "import sys; sys.argv[1:] == ['warm'] and conf['post_worker_init'](None); "
        "regexes = [EmailValidator.domain_regex, EmailValidator.user_regex]; "
        "print(sum(r._wrapped is not empty for r in regexes)); "
        "walk = lambda ps: sum((walk(p.url_patterns) if isinstance(p, URLResolver) else 0) "
        "+ ('regex' in p.pattern.__dict__) for p in ps); "
        "print(walk(get_resolver().url_patterns)); "
        "print(sum(m in sys.modules for m in ('psycopg_pool', 'redis.client', 'celery.app.amqp', 'celery.app.task')))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": "test-only-secret-key-for-the-web-worker-tests",
        "ALLOWED_HOSTS": "127.0.0.1",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }

    def loaded(*args: str) -> tuple[int, int, int]:
        done = subprocess.run(
            [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, check=True
        )
        validators, patterns, modules = map(int, done.stdout.split()[-3:])
        return validators, patterns, modules

    assert loaded() == (0, 0, 0)  # nothing of it done by loading alone: the check can tell
    validators, patterns, modules = loaded("warm")
    assert validators == 2 and patterns > 100 and modules == 4, (validators, patterns, modules)


def test_a_second_quit_signal_during_the_first_does_not_hang_the_worker():
    """Ctrl-C sends SIGINT to every process of `make run`, and the master then sends its
    workers SIGQUIT: the second signal's handler can run inside the first one, while the
    thread pool's shutdown holds its lock. The worker must still exit at once, not wait
    for the master's SIGKILL after the graceful timeout."""
    import threading
    import types
    from concurrent import futures

    worker = web_worker.BalancedThreadWorker.__new__(web_worker.BalancedThreadWorker)
    worker.alive = True
    worker.cfg = types.SimpleNamespace(worker_int=lambda _worker: None)
    worker.tpool = futures.ThreadPoolExecutor(max_workers=1)  # no thread started: nothing to join
    queue = worker.tpool._work_queue

    class SignalInsideShutdown:
        """The pool's queue, whose first put (made under the pool's shutdown lock) is
        interrupted by the master's SIGQUIT."""

        interrupted = False

        def put(self, item: object) -> None:
            if not self.interrupted:
                self.interrupted = True
                worker.handle_quit(signal.SIGQUIT, None)
            queue.put(item)

    worker.tpool._work_queue = SignalInsideShutdown()
    exited: list[int] = []

    def quit_on_ctrl_c() -> None:
        try:
            worker.handle_quit(signal.SIGINT, None)
        except SystemExit as exit_:
            exited.append(exit_.code)

    thread = threading.Thread(target=quit_on_ctrl_c, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "the worker hung on its second quit signal"
    assert exited == [0] and not worker.alive
