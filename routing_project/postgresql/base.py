"""Django's PostgreSQL backend, with a cheaper health check for pooled connections.

With CONN_HEALTH_CHECKS, Django has psycopg's pool run `ConnectionPool.check_connection` on
every borrow: an empty query, one round trip to the server per request before any work.
`idle_connection_check` asks the kernel instead: an idle connection has nothing to read
unless the server said something, and what a server says to an idle client is, in practice,
that it is going away (shutdown, restart, pg_terminate_backend: an error message, then end
of file). Only then is the full check run, which raises for a dead connection; the pool
throws it away and hands out another, so the request never sees it.
"""

from __future__ import annotations

import select
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base


def idle_connection_check(conn: Any) -> None:
    """Raises if a pooled connection is unusable; a round trip only when its socket is readable."""
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise conn.OperationalError("the connection is closed")  # caught by the pool: discarded
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        """As Django's, with `idle_connection_check` as the pool's check when CONN_HEALTH_CHECKS is on."""
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        pools: dict[str, Any] = self._connection_pools  # type: ignore[attr-defined]  # Django's, class-wide
        if self.alias not in pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            from psycopg_pool import ConnectionPool

            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # Django sets autocommit itself afterwards
            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]
                check=idle_connection_check if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if pool_options is True else pool_options),
            )
            # Threads racing here: the first pool stored wins (none is open yet).
            pools.setdefault(self.alias, pool)
        return pools[self.alias]
